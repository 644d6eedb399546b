//! The seeded, deterministic capacity market: which regions, zones and instance types exist, how
//! much capacity is free on each market day (11:30 UTC to 11:30 UTC) for Capacity Blocks, training
//! plans and on-demand, what it costs, and how AWS's offering rules turn a search into offerings.
//! Everything here is a pure function of the seed and the recorded purchases, so the property tests
//! can drive it without a server.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use rust_decimal::Decimal;
use serde::Serialize;

use crate::error::ApiError;
use crate::util::{day_start, hex_id, market_day, next_1130_after, stable_hash};

/// Capacity Blocks and plans can start up to 8 weeks ahead.
pub const BOOKING_HORIZON_DAYS: i64 = 56;
/// The earliest an offering may start, counted from the search.
pub const EARLIEST_START_MINUTES: i64 = 30;
/// Capacity Block searches return at most this many offerings.
pub const MAX_BLOCK_OFFERINGS: usize = 6;
/// Training plan searches return at most this many offerings.
pub const MAX_PLAN_OFFERINGS: usize = 3;
/// Instance counts a training plan may reserve.
pub const PLAN_COUNTS: [i64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// One instance type the market knows.
#[derive(Debug, Clone, Serialize)]
pub struct TypeSpec {
    /// EC2 name, e.g. `p5.48xlarge`; the SageMaker type is `ml.` + this.
    pub name: &'static str,
    /// On-demand USD per instance-hour (EC2).
    pub on_demand_usd: Decimal,
    /// Capacity Block USD per instance-hour at nominal demand.
    pub block_usd: Decimal,
    /// Sold as Capacity Blocks.
    pub capacity_block: bool,
    /// Sold as SageMaker training plans.
    pub training_plan: bool,
    /// Blocks of this type terminate 60 min before the end, with a 70-min warning.
    pub ultraserver: bool,
    /// Typical free block capacity per zone and day.
    pub block_pool: u32,
    /// Typical free on-demand (and spot) capacity per zone.
    pub on_demand_pool: u32,
}

/// A region and its zones.
#[derive(Debug, Clone, Serialize)]
pub struct RegionSpec {
    pub name: String,
    pub azs: Vec<String>,
}

fn d(s: &str) -> Decimal {
    s.parse().expect("valid decimal literal")
}

/// The default instance-type table. On-demand prices follow the public list prices where the
/// source articles give them (p5.48xlarge: $55.04 on-demand, $34.608 in a block); block prices
/// are on-demand x 34.608/55.04 (about 37% below), plans 70-75% below SageMaker on-demand.
pub fn default_types() -> Vec<TypeSpec> {
    let ratio = d("34.608") / d("55.04");
    let t = |name, od: &str, cb: bool, tp: bool, ultra: bool, pool: u32, odp: u32| {
        let od = d(od);
        let block = if name == "p5.48xlarge" {
            d("34.608")
        } else {
            (od * ratio).round_dp(3)
        };
        TypeSpec {
            name,
            on_demand_usd: od,
            block_usd: block,
            capacity_block: cb,
            training_plan: tp,
            ultraserver: ultra,
            block_pool: pool,
            on_demand_pool: odp,
        }
    };
    vec![
        t("p5.48xlarge", "55.04", true, true, false, 48, 4),
        t("p5e.48xlarge", "63.296", true, true, false, 32, 2),
        t("p5en.48xlarge", "66.28", true, true, false, 32, 2),
        t("p5.4xlarge", "6.88", true, true, false, 64, 8),
        t("p4d.24xlarge", "32.7726", true, true, false, 48, 4),
        t("p4de.24xlarge", "40.9657", true, true, false, 24, 2),
        t("p6-b200.48xlarge", "113.9328", true, true, false, 24, 1),
        t("p6-b300.48xlarge", "142.416", true, true, false, 16, 1),
        t("trn1.32xlarge", "21.50", true, true, false, 64, 8),
        t("trn2.48xlarge", "44.7", true, true, false, 48, 4),
        t("p6e-gb200.36xlarge", "190.0", true, true, true, 36, 0),
        t("g5.xlarge", "1.006", false, false, false, 0, 64),
        t("m5.large", "0.096", false, false, false, 0, 256),
        t("c5.xlarge", "0.17", false, false, false, 0, 256),
    ]
}

/// The default regions and zones.
pub fn default_regions() -> Vec<RegionSpec> {
    let r = |name: &str, zones: &str| RegionSpec {
        name: name.to_string(),
        azs: zones.chars().map(|z| format!("{name}{z}")).collect(),
    };
    vec![
        r("us-east-1", "abcd"),
        r("us-east-2", "abc"),
        r("us-west-2", "abcd"),
        r("eu-west-1", "abc"),
        r("ap-northeast-1", "acd"),
    ]
}

/// Is `hours` a Capacity Block duration: 1-14 days by 1 day, then 21-182 days by 7?
pub fn valid_block_hours(hours: i64) -> bool {
    if hours <= 0 || hours % 24 != 0 {
        return false;
    }
    let days = hours / 24;
    (1..=14).contains(&days) || ((21..=182).contains(&days) && days % 7 == 0)
}

/// The valid block durations (in days) just below and above `days`.
fn neighbour_block_days(days: i64) -> Vec<i64> {
    let all: Vec<i64> = (1..=14).chain((21..=182).step_by(7)).collect();
    let pos = all.iter().position(|&x| x == days);
    match pos {
        Some(i) => {
            let mut out = Vec::new();
            if i > 0 {
                out.push(all[i - 1]);
            }
            if i + 1 < all.len() {
                out.push(all[i + 1]);
            }
            out
        }
        None => Vec::new(),
    }
}

/// A Capacity Block search, as `DescribeCapacityBlockOfferings` receives it.
#[derive(Debug, Clone)]
pub struct BlockSearch {
    pub region: String,
    pub instance_type: String,
    pub instance_count: i64,
    pub duration_hours: i64,
    pub start_range: Option<DateTime<Utc>>,
    pub end_range: Option<DateTime<Utc>>,
}

/// A Capacity Block offering.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockOffering {
    pub id: String,
    pub region: String,
    pub availability_zone: String,
    pub instance_type: String,
    pub instance_count: i64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub hourly_usd: Decimal,
    pub upfront_fee: Decimal,
}

impl BlockOffering {
    /// `CapacityBlockDurationHours`: whole hours of the block.
    pub fn duration_hours(&self) -> i64 {
        (self.end - self.start).num_minutes() / 60
    }
    /// `CapacityBlockDurationMinutes`: the minutes beyond the whole hours.
    pub fn duration_minutes(&self) -> i64 {
        (self.end - self.start).num_minutes() % 60
    }
}

/// A training plan search, as `SearchTrainingPlanOfferings` receives it.
#[derive(Debug, Clone)]
pub struct PlanSearch {
    pub region: String,
    pub instance_type: String,
    pub instance_count: i64,
    pub duration_hours: i64,
    pub start_after: Option<DateTime<Utc>>,
    pub end_before: Option<DateTime<Utc>>,
    pub target: String,
}

/// One reserved capacity inside a plan offering.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    pub availability_zone: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

impl Segment {
    /// Whole hours (`DurationHours`).
    pub fn hours(&self) -> i64 {
        (self.end - self.start).num_hours()
    }
    /// The minutes beyond the whole hours (`DurationMinutes`).
    pub fn extra_minutes(&self) -> i64 {
        (self.end - self.start).num_minutes() % 60
    }
    pub fn minutes(&self) -> i64 {
        (self.end - self.start).num_minutes()
    }
}

/// A training plan offering.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanOffering {
    pub id: String,
    pub region: String,
    pub instance_type: String,
    pub instance_count: i64,
    pub target: String,
    pub segments: Vec<Segment>,
    pub hourly_usd: Decimal,
    pub upfront_fee: Decimal,
    pub requested_start_after: Option<DateTime<Utc>>,
    pub requested_end_before: Option<DateTime<Utc>>,
}

impl PlanOffering {
    pub fn start(&self) -> DateTime<Utc> {
        self.segments[0].start
    }
    pub fn end(&self) -> DateTime<Utc> {
        self.segments[self.segments.len() - 1].end
    }
    pub fn total_minutes(&self) -> i64 {
        self.segments.iter().map(Segment::minutes).sum()
    }
    /// Whole hours over all segments (`DurationHours`).
    pub fn total_hours(&self) -> i64 {
        self.total_minutes() / 60
    }
    /// The minutes beyond them (`DurationMinutes`).
    pub fn extra_minutes(&self) -> i64 {
        self.total_minutes() % 60
    }
}

/// Which capacity pool a reservation draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Pool {
    CapacityBlock,
    TrainingPlan,
}

/// The market: seeded capacity and prices, minus what has been bought.
#[derive(Debug, Clone)]
pub struct Market {
    pub seed: u64,
    pub regions: Vec<RegionSpec>,
    pub types: Vec<TypeSpec>,
    /// (EC2 type, region) pairs not sold as Capacity Blocks or training plans there
    /// (aws-reference §11.1 "Block instance types are regional"); a region outside
    /// `regions` sells neither.
    pub unsupported: BTreeSet<(String, String)>,
    used: HashMap<(Pool, String, String, String, i64), u32>,
}

/// The default regional catalogue's gaps. The sources give two pairs (c7i.4xlarge in
/// us-west-2, trn2.3xlarge in us-east-2) of types this table does not hold; these are the
/// same kind of gap for the types it does, chosen so each default region lacks something.
pub fn default_unsupported() -> BTreeSet<(String, String)> {
    [
        ("trn2.48xlarge", "us-east-2"),
        ("trn1.32xlarge", "eu-west-1"),
        ("p5.48xlarge", "eu-west-1"),
        ("p5en.48xlarge", "us-west-2"),
        ("p5.4xlarge", "ap-northeast-1"),
        ("p6-b300.48xlarge", "us-east-2"),
        ("p6-b300.48xlarge", "eu-west-1"),
        ("p6-b300.48xlarge", "ap-northeast-1"),
        ("p6e-gb200.36xlarge", "us-east-2"),
        ("p6e-gb200.36xlarge", "us-west-2"),
        ("p6e-gb200.36xlarge", "eu-west-1"),
        ("p6e-gb200.36xlarge", "ap-northeast-1"),
    ]
    .into_iter()
    .map(|(t, r)| (t.to_string(), r.to_string()))
    .collect()
}

impl Market {
    /// The default market for a seed.
    pub fn new(seed: u64) -> Market {
        Market {
            seed,
            regions: default_regions(),
            types: default_types(),
            unsupported: default_unsupported(),
            used: HashMap::new(),
        }
    }

    /// Whether `instance_type` (EC2 or `ml.` name) is sold as blocks and plans in `region`.
    pub fn sold_in(&self, instance_type: &str, region: &str) -> bool {
        let ec2 = instance_type.strip_prefix("ml.").unwrap_or(instance_type);
        self.regions.iter().any(|r| r.name == region)
            && !self
                .unsupported
                .contains(&(ec2.to_string(), region.to_string()))
    }

    /// A region's zones; unknown regions get three zones so any region can be used.
    pub fn region(&self, name: &str) -> RegionSpec {
        self.regions
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .unwrap_or_else(|| RegionSpec {
                name: name.to_string(),
                azs: ["a", "b", "c"]
                    .iter()
                    .map(|z| format!("{name}{z}"))
                    .collect(),
            })
    }

    /// The spec of an EC2 type (`p5.48xlarge`) or SageMaker type (`ml.p5.48xlarge`).
    pub fn type_spec(&self, name: &str) -> Option<&TypeSpec> {
        let bare = name.strip_prefix("ml.").unwrap_or(name);
        self.types.iter().find(|t| t.name == bare)
    }

    fn h(&self, parts: &[&str]) -> u64 {
        let seed = self.seed.to_string();
        let mut all = vec![seed.as_str()];
        all.extend_from_slice(parts);
        stable_hash(&all)
    }

    /// Seeded total capacity of a pool on one market day in one zone.
    pub fn total(&self, pool: Pool, region: &str, az: &str, ty: &str, day: i64) -> u32 {
        let Some(spec) = self.type_spec(ty) else {
            return 0;
        };
        let eligible = match pool {
            Pool::CapacityBlock => spec.capacity_block,
            Pool::TrainingPlan => spec.training_plan,
        };
        if !eligible {
            return 0;
        }
        let pool_name = format!("{pool:?}");
        let day_s = day.to_string();
        let h = self.h(&[&pool_name, region, az, spec.name, &day_s]);
        // about one zone-day in six is sold out; the rest have 40-100% of the typical pool
        if h.is_multiple_of(6) {
            return 0;
        }
        let share = 40 + (h >> 8) % 61;
        let total = u64::from(spec.block_pool) * share / 100;
        total.clamp(1, 64) as u32
    }

    /// Capacity still free on one day.
    pub fn free(&self, pool: Pool, region: &str, az: &str, ty: &str, day: i64) -> u32 {
        let bare = ty.strip_prefix("ml.").unwrap_or(ty).to_string();
        let used = self
            .used
            .get(&(pool, region.to_string(), az.to_string(), bare, day))
            .copied()
            .unwrap_or(0);
        self.total(pool, region, az, ty, day).saturating_sub(used)
    }

    /// Smallest free capacity over the market days that `[start, end)` touches.
    pub fn free_between(
        &self,
        pool: Pool,
        region: &str,
        az: &str,
        ty: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> u32 {
        days_of(start, end)
            .map(|day| self.free(pool, region, az, ty, day))
            .min()
            .unwrap_or(0)
    }

    /// Records a purchase (positive) or a release (negative) over `[start, end)`.
    pub fn consume(
        &mut self,
        pool: Pool,
        region: &str,
        az: &str,
        ty: &str,
        (start, end): (DateTime<Utc>, DateTime<Utc>),
        count: i64,
    ) {
        let bare = ty.strip_prefix("ml.").unwrap_or(ty).to_string();
        for day in days_of(start, end) {
            let e = self
                .used
                .entry((pool, region.to_string(), az.to_string(), bare.clone(), day))
                .or_insert(0);
            *e = (i64::from(*e) + count).max(0) as u32;
        }
    }

    /// Demand on a day in permille: seeded noise blended with how much is already sold.
    fn demand_permille(&self, pool: Pool, region: &str, az: &str, ty: &str, day: i64) -> i64 {
        let day_s = day.to_string();
        let noise = (self.h(&["demand", region, ty, &day_s]) % 1001) as i64;
        let total = i64::from(self.total(pool, region, az, ty, day));
        let free = i64::from(self.free(pool, region, az, ty, day));
        let sold = if total == 0 {
            1000
        } else {
            (total - free) * 1000 / total
        };
        // 0..=1000: mostly seeded noise, pushed up as the day sells out
        (noise * 8 + sold * 2) / 10
    }

    fn avg_demand(
        &self,
        pool: Pool,
        region: &str,
        az: &str,
        ty: &str,
        (start, end): (DateTime<Utc>, DateTime<Utc>),
    ) -> i64 {
        let days: Vec<i64> = days_of(start, end).take(14).collect();
        if days.is_empty() {
            return 500;
        }
        days.iter()
            .map(|&day| self.demand_permille(pool, region, az, ty, day))
            .sum::<i64>()
            / days.len() as i64
    }

    /// Capacity Block price per instance-hour: the list price x (0.9 .. 1.1) with demand.
    pub fn block_hourly(
        &self,
        region: &str,
        az: &str,
        ty: &str,
        window: (DateTime<Utc>, DateTime<Utc>),
    ) -> Decimal {
        let spec = self.type_spec(ty).expect("caller checked the type");
        let demand = self
            .avg_demand(Pool::CapacityBlock, region, az, ty, window)
            .clamp(0, 1000);
        let factor = Decimal::new(900 + demand / 5, 3);
        (spec.block_usd * factor).round_dp(3)
    }

    /// SageMaker on-demand price per instance-hour (EC2 list price + 15% managed-service premium).
    pub fn sagemaker_on_demand_hourly(&self, ty: &str) -> Option<Decimal> {
        self.type_spec(ty)
            .map(|s| (s.on_demand_usd * Decimal::new(115, 2)).round_dp(3))
    }

    /// Training plan price per instance-hour: 70-75% below SageMaker on-demand, with demand.
    pub fn plan_hourly(&self, region: &str, segs: &[Segment], ty: &str) -> Decimal {
        let od = self.sagemaker_on_demand_hourly(ty).expect("caller checked");
        let demand = segs
            .iter()
            .map(|s| {
                self.avg_demand(
                    Pool::TrainingPlan,
                    region,
                    &s.availability_zone,
                    ty,
                    (s.start, s.end),
                )
            })
            .sum::<i64>()
            / segs.len().max(1) as i64;
        let factor = Decimal::new(250 + demand.clamp(0, 1000) / 20, 3);
        (od * factor).round_dp(3)
    }

    /// `DescribeCapacityBlockOfferings` by AWS's rules: the lowest-priced offerings in the date
    /// range, for the requested duration and its neighbours, at most six.
    pub fn search_blocks(
        &self,
        now: DateTime<Utc>,
        q: &BlockSearch,
    ) -> Result<Vec<BlockOffering>, ApiError> {
        if !(1..=64).contains(&q.instance_count) {
            return Err(ApiError::invalid(format!(
                "Invalid instance count {}: Capacity Blocks support 1 to 64 instances",
                q.instance_count
            )));
        }
        if !valid_block_hours(q.duration_hours) {
            return Err(ApiError::invalid(format!(
                "Invalid CapacityDurationHours {}: durations are 1-14 days in 1-day increments, then 7-day increments up to 182 days",
                q.duration_hours
            )));
        }
        match self.type_spec(&q.instance_type) {
            Some(s)
                if s.capacity_block
                    && !q.instance_type.starts_with("ml.")
                    && self.sold_in(&q.instance_type, &q.region) => {}
            _ => {
                return Err(ApiError::invalid(format!(
                    "The instance type '{}' is not supported for Capacity Blocks in '{}'",
                    q.instance_type, q.region
                )));
            }
        }
        if let (Some(s), Some(e)) = (q.start_range, q.end_range)
            && e <= s
        {
            return Err(ApiError::invalid(
                "EndDateRange must be after StartDateRange",
            ));
        }
        let earliest = round_up_5min(
            q.start_range
                .unwrap_or(now)
                .max(now + TimeDelta::minutes(EARLIEST_START_MINUTES)),
        );
        let latest_start = now + TimeDelta::days(BOOKING_HORIZON_DAYS);
        if earliest > latest_start {
            return Ok(Vec::new());
        }
        let days = q.duration_hours / 24;
        let region = self.region(&q.region);
        let mut found: Vec<(bool, BlockOffering)> = Vec::new();
        for az in &region.azs {
            // a block starting at the earliest moment: whole days plus the partial first day;
            // and one a day shorter, so shorter than asked (aws-reference §11.1: a 24 h
            // search has returned 8 h, 24 h and 32 h offerings)
            if earliest.time() != crate::util::end_of_day_time() {
                let end = next_1130_after(earliest) + TimeDelta::days(days);
                if let Some(o) = self.block_if_free(q, az, earliest, end) {
                    found.push((true, o));
                }
                if days == 1 || valid_block_hours((days - 1) * 24) {
                    let end = next_1130_after(earliest) + TimeDelta::days(days - 1);
                    if let Some(o) = self.block_if_free(q, az, earliest, end) {
                        found.push((false, o));
                    }
                }
            }
            let mut durations = vec![days];
            durations.extend(neighbour_block_days(days));
            for (i, dd) in durations.into_iter().enumerate() {
                let first = if earliest.time() == crate::util::end_of_day_time() {
                    market_day(earliest)
                } else {
                    market_day(earliest) + 1
                };
                let last = market_day(latest_start);
                let mut best: Option<BlockOffering> = None;
                for k in first..=last {
                    let start = day_start(k);
                    if start < earliest || start > latest_start {
                        continue;
                    }
                    let end = day_start(k + dd);
                    if let Some(o) = self.block_if_free(q, az, start, end)
                        && best.as_ref().is_none_or(|b| o.hourly_usd < b.hourly_usd)
                    {
                        best = Some(o);
                    }
                }
                if let Some(b) = best {
                    found.push((i == 0, b));
                }
            }
        }
        // the requested duration first, cheapest first, then the neighbours
        found.sort_by(|(ra, a), (rb, b)| {
            rb.cmp(ra)
                .then(a.hourly_usd.cmp(&b.hourly_usd))
                .then(a.start.cmp(&b.start))
                .then(a.availability_zone.cmp(&b.availability_zone))
        });
        // The earliest blocks (a partial first day, shorter and longer than asked) follow the
        // cheapest of the requested duration, so the six answered mix lengths as AWS's do.
        let mut ordered: Vec<BlockOffering> = Vec::new();
        let mut rest: Vec<BlockOffering> = Vec::new();
        for (i, (_, o)) in found.into_iter().enumerate() {
            if i == 0 || o.start == earliest {
                ordered.push(o);
            } else {
                rest.push(o);
            }
        }
        ordered.extend(rest);
        let mut seen = BTreeSet::new();
        Ok(ordered
            .into_iter()
            .filter(|o| seen.insert(o.id.clone()))
            .take(MAX_BLOCK_OFFERINGS)
            .collect())
    }

    fn block_if_free(
        &self,
        q: &BlockSearch,
        az: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Option<BlockOffering> {
        if q.end_range.is_some_and(|e| end > e) {
            return None;
        }
        let free = self.free_between(
            Pool::CapacityBlock,
            &q.region,
            az,
            &q.instance_type,
            start,
            end,
        );
        if i64::from(free) < q.instance_count {
            return None;
        }
        let hourly = self.block_hourly(&q.region, az, &q.instance_type, (start, end));
        let minutes = (end - start).num_minutes();
        let upfront = (hourly * Decimal::from(q.instance_count) * Decimal::from(minutes)
            / Decimal::from(60))
        .round_dp(2);
        let seed = self.seed.to_string();
        let id = hex_id(
            "cb-",
            &[
                &seed,
                &q.region,
                az,
                &q.instance_type,
                &start.to_rfc3339(),
                &end.to_rfc3339(),
                &q.instance_count.to_string(),
            ],
        );
        Some(BlockOffering {
            id,
            region: q.region.clone(),
            availability_zone: az.to_string(),
            instance_type: q.instance_type.clone(),
            instance_count: q.instance_count,
            start,
            end,
            hourly_usd: hourly,
            upfront_fee: upfront,
        })
    }

    /// `SearchTrainingPlanOfferings` by the developer guide's rules: contiguous blocks first,
    /// else splits into two segments; at most three offerings; HyperPod and endpoint offerings in
    /// one zone.
    pub fn search_plans(
        &self,
        now: DateTime<Utc>,
        q: &PlanSearch,
    ) -> Result<Vec<PlanOffering>, ApiError> {
        match self.type_spec(&q.instance_type) {
            Some(s) if s.training_plan && q.instance_type.starts_with("ml.") => {}
            _ => {
                return Err(ApiError::validation(format!(
                    "1 validation error detected: Value '{}' at 'instanceType' failed to satisfy constraint: Member must be a supported training plan instance type",
                    q.instance_type
                )));
            }
        }
        if !PLAN_COUNTS.contains(&q.instance_count) {
            return Err(ApiError::validation(format!(
                "Invalid InstanceCount {}: training plans reserve 1, 2, 4, 8, 16, 32 or 64 instances",
                q.instance_count
            )));
        }
        if !["training-job", "hyperpod-cluster", "endpoint"].contains(&q.target.as_str()) {
            return Err(ApiError::validation(format!(
                "Invalid TargetResources value '{}'",
                q.target
            )));
        }
        if q.duration_hours < 1 || q.duration_hours > 182 * 24 {
            return Err(ApiError::validation(format!(
                "Invalid DurationHours {}: plans last 1 to 182 days",
                q.duration_hours
            )));
        }
        let days = (q.duration_hours + 23) / 24;
        let earliest = q
            .start_after
            .unwrap_or(now)
            .max(now + TimeDelta::minutes(EARLIEST_START_MINUTES));
        let first = if earliest == day_start(market_day(earliest)) {
            market_day(earliest)
        } else {
            market_day(earliest) + 1
        };
        let last = market_day(now + TimeDelta::days(BOOKING_HORIZON_DAYS));
        let region = self.region(&q.region);
        let one_az = q.target != "training-job";

        // contiguous blocks: the earliest one in each zone
        let mut contiguous: Vec<Vec<Segment>> = Vec::new();
        for az in &region.azs {
            if let Some(seg) = self.first_free_segment(q, az, first, last, days) {
                contiguous.push(vec![seg]);
            }
        }
        // aws-reference §11.2: plans start at least 30 min out and end at 11:30, so a search
        // starting off 11:30 also answers the partial first day: a 15 h search has returned
        // 15 h 51 min, 39 h 51 min and 24 h. Per zone, the partial day plus the days asked
        // and plus a day less (which may be only the partial day), when free.
        let partial_start = round_up_5min(earliest);
        if partial_start != day_start(market_day(partial_start)) {
            let first_end = next_1130_after(partial_start);
            for az in &region.azs {
                for extra in [days, days - 1] {
                    let end = first_end + TimeDelta::days(extra);
                    if extra < 0 || q.end_before.is_some_and(|e| end > e) {
                        continue;
                    }
                    let free = self.free_between(
                        Pool::TrainingPlan,
                        &q.region,
                        az,
                        &q.instance_type,
                        partial_start,
                        end,
                    );
                    if i64::from(free) >= q.instance_count {
                        contiguous.push(vec![Segment {
                            availability_zone: az.to_string(),
                            start: partial_start,
                            end,
                        }]);
                    }
                }
                if contiguous.iter().any(|c| c[0].start == partial_start) {
                    break;
                }
            }
        }
        let mut options = contiguous;
        if options.is_empty() && days >= 2 {
            let mut splits = vec![days / 2, (days / 3).max(1), days - (days / 3).max(1)];
            splits.dedup();
            let mut seen = BTreeSet::new();
            for a in splits {
                if a < 1 || a >= days || !seen.insert(a) {
                    continue;
                }
                let b = days - a;
                let mut best: Option<Vec<Segment>> = None;
                for az1 in &region.azs {
                    let Some(s1) = self.first_free_segment(q, az1, first, last, a) else {
                        continue;
                    };
                    let after = market_day(s1.end);
                    let zones: Vec<&String> = if one_az {
                        vec![az1]
                    } else {
                        region.azs.iter().collect()
                    };
                    for az2 in zones {
                        if let Some(s2) = self.first_free_segment(q, az2, after, last, b) {
                            let cand = vec![s1.clone(), s2];
                            if best.as_ref().is_none_or(|bst| cand[1].end < bst[1].end) {
                                best = Some(cand);
                            }
                        }
                    }
                }
                if let Some(b) = best {
                    options.push(b);
                }
            }
        }
        options.sort_by(|a, b| {
            a[a.len() - 1]
                .end
                .cmp(&b[b.len() - 1].end)
                .then(a[0].availability_zone.cmp(&b[0].availability_zone))
        });
        let seed = self.seed.to_string();
        Ok(options
            .into_iter()
            .take(MAX_PLAN_OFFERINGS)
            .map(|segments| {
                let hourly = self.plan_hourly(&q.region, &segments, &q.instance_type);
                let minutes: i64 = segments.iter().map(Segment::minutes).sum();
                let hours = minutes / 60;
                let upfront = (hourly * Decimal::from(minutes) * Decimal::from(q.instance_count)
                    / Decimal::from(60))
                .round_dp(2);
                let key: Vec<String> = segments
                    .iter()
                    .map(|s| format!("{}@{}", s.availability_zone, s.start.timestamp()))
                    .collect();
                let id = hex_id(
                    "tpo-",
                    &[
                        &seed,
                        &q.region,
                        &q.instance_type,
                        &q.instance_count.to_string(),
                        &q.target,
                        &key.join(","),
                        &hours.to_string(),
                    ],
                );
                PlanOffering {
                    id,
                    region: q.region.clone(),
                    instance_type: q.instance_type.clone(),
                    instance_count: q.instance_count,
                    target: q.target.clone(),
                    segments,
                    hourly_usd: hourly,
                    upfront_fee: upfront,
                    requested_start_after: q.start_after,
                    requested_end_before: q.end_before,
                }
            })
            .collect())
    }

    fn first_free_segment(
        &self,
        q: &PlanSearch,
        az: &str,
        first: i64,
        last: i64,
        days: i64,
    ) -> Option<Segment> {
        for k in first..=last {
            let (start, end) = (day_start(k), day_start(k + days));
            if q.end_before.is_some_and(|e| end > e) {
                return None;
            }
            let free = self.free_between(
                Pool::TrainingPlan,
                &q.region,
                az,
                &q.instance_type,
                start,
                end,
            );
            if i64::from(free) >= q.instance_count {
                return Some(Segment {
                    availability_zone: az.to_string(),
                    start,
                    end,
                });
            }
        }
        None
    }

    /// Seeded on-demand (or spot) capacity of a zone for a type; unknown types are plentiful.
    pub fn on_demand_total(&self, region: &str, az: &str, ty: &str, spot: bool) -> i64 {
        match self.type_spec(ty) {
            None => 256,
            Some(spec) => {
                let kind = if spot { "spot" } else { "on-demand" };
                let h = self.h(&[kind, region, az, spec.name]);
                let pool = i64::from(spec.on_demand_pool);
                if pool == 0 {
                    0
                } else {
                    (pool / 2 + (h % (pool as u64 + 1)) as i64).min(pool)
                }
            }
        }
    }
}

/// The market days that `[start, end)` touches.
pub fn days_of(start: DateTime<Utc>, end: DateTime<Utc>) -> impl Iterator<Item = i64> {
    let first = market_day(start);
    let last = market_day(end - TimeDelta::seconds(1));
    first..=last
}

fn round_up_5min(t: DateTime<Utc>) -> DateTime<Utc> {
    let t = t
        .with_nanosecond(0)
        .expect("valid")
        .with_second(0)
        .expect("valid")
        + if t.second() > 0 || t.nanosecond() > 0 {
            TimeDelta::minutes(1)
        } else {
            TimeDelta::zero()
        };
    let rem = i64::from(t.minute() % 5);
    if rem == 0 {
        t
    } else {
        t + TimeDelta::minutes(5 - rem)
    }
}
