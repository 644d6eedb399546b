//! The planner: from the offerings found (possibly across regions), pick the feasible
//! plans and rank them, explaining the choice and every rejection.
//!
//! A plan is one offering, or (with `allow_split`) two Capacity Block offerings of the
//! same type, count and region that do not overlap and together cover the duration while
//! neither does alone. Best follows the request's objective (ARCHITECTURE §8.1):
//! `cheapest` means the lowest upfront fee, then the earlier start; `earliest` the earlier
//! start, then the lowest fee; then fewer segments, then the more preferred instance type.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::catalog::PriceTable;
use super::money::Usd;
use super::offering::{Offering, Product};
use super::request::{CapacityRequest, Prefer};
use super::time_rules::PURCHASE_LEAD;

/// A way to satisfy a request, with the reason it ranks where it does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Plan {
    /// One offering, or two Capacity Block offerings in start order.
    pub offerings: Vec<Offering>,
    pub product: Product,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub upfront_fee: Usd,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Segments over all offerings.
    pub segments: usize,
    /// Reserved hours (per instance) over all segments.
    pub covered_hours: Decimal,
    /// The on-demand cost of the same instance-hours, when the price is known.
    pub on_demand_cost: Option<Usd>,
    /// `on_demand_cost - upfront_fee`.
    pub saving: Option<Usd>,
    pub reason: String,
}

impl Plan {
    /// Hours per instance a workload can run in it: each segment from its start to its drain
    /// (its end less AWS's forced-termination lead and the drain lead, as the windows are
    /// drained), summed.
    pub fn usable_hours(&self, drain: super::window::DrainLead) -> Decimal {
        let kind = super::time_rules::WindowKind::of(self.product, false);
        let minutes: i64 = self
            .offerings
            .iter()
            .flat_map(|o| &o.segments)
            .map(|s| {
                let drain_at = super::time_rules::drain_start(
                    s.end,
                    kind,
                    drain.requested_minutes,
                    drain.default_minutes,
                );
                (drain_at - s.start).num_minutes().max(0)
            })
            .sum();
        Decimal::from(minutes) / Decimal::from(60)
    }

    /// The share of its reserved instance-hours below which the same use on demand would have
    /// cost less: fee / on-demand cost of the whole reservation. Above 1, on demand is cheaper
    /// even used throughout. `None` without an on-demand price.
    pub fn break_even_use(&self) -> Option<Decimal> {
        let od = self.on_demand_cost?.amount();
        (od > Decimal::ZERO).then(|| self.upfront_fee.amount() / od)
    }

    pub fn offering_ids(&self) -> Vec<&str> {
        self.offerings.iter().map(|o| o.id.as_str()).collect()
    }
    pub fn is_split(&self) -> bool {
        self.segments > 1
    }
}

/// Why an offering is not (part of) the chosen plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Rejection {
    pub offering_id: String,
    pub region: String,
    pub reason: String,
}

/// The account's limit of instances across Capacity Blocks (review aws-reality-2 #6: "Each
/// Capacity Block can have up to 64 instances, and you can have up to 256 instances across
/// Capacity Blocks", the EC2 model's `DescribeCapacityBlockOfferingsRequest.InstanceCount`):
/// a Capacity Block offering whose instances, with those of every live block in `live` whose
/// window overlaps its own (whoever bought it), would pass `max` is rejected with the reason;
/// the rest, and every offering of another product, pass. The sum over every overlapping
/// block is what the documented sentence reads as, at its harshest: not the peak at any
/// instant.
pub fn within_block_limit(
    offerings: &[Offering],
    live: &[crate::domain::reservation::Reservation],
    max: u32,
) -> (Vec<Offering>, Vec<Rejection>) {
    let mut usable = Vec::new();
    let mut over = Vec::new();
    for o in offerings {
        if o.product != Product::CapacityBlock {
            usable.push(o.clone());
            continue;
        }
        let overlapping: Vec<&crate::domain::reservation::Reservation> = live
            .iter()
            .filter(|r| {
                r.product == Product::CapacityBlock
                    && r.state.is_live()
                    && r.start() < o.end()
                    && o.start() < r.end()
            })
            .collect();
        let held: u32 = overlapping.iter().map(|r| r.instance_count).sum();
        if held + o.instance_count <= max {
            usable.push(o.clone());
            continue;
        }
        over.push(Rejection {
            offering_id: o.id.clone(),
            region: o.region.clone(),
            reason: format!(
                "the account holds {held} instances in {} Capacity Block(s) over this \
                 offering's window ({} to {}); its {} more would pass the limit of {max} \
                 instances across Capacity Blocks (MAX_BLOCK_INSTANCES)",
                overlapping.len(),
                o.start(),
                o.end(),
                o.instance_count
            ),
        });
    }
    (usable, over)
}

/// The planner's answer: feasible plans best first, and a reason for every other offering.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Planning {
    pub plans: Vec<Plan>,
    pub rejections: Vec<Rejection>,
}

impl Planning {
    pub fn best(&self) -> Option<&Plan> {
        self.plans.first()
    }
}

/// The ranking key: lower is better. Offering ids make the order total and deterministic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RankKey {
    /// The start, when the objective is `earliest` (so it ranks first); none otherwise.
    pub earliest: Option<DateTime<Utc>>,
    pub upfront_fee: Usd,
    pub start: DateTime<Utc>,
    pub segments: usize,
    pub type_preference: usize,
    pub tie_break: Vec<String>,
}

/// Plans the request against `offerings` at `now`.
pub fn plan(
    request: &CapacityRequest,
    offerings: &[Offering],
    prices: &PriceTable,
    now: DateTime<Utc>,
) -> Planning {
    let mut plans: Vec<(RankKey, Vec<usize>)> = Vec::new();
    // Per offering: the reasons it fails alone, and whether only its length failed.
    let mut verdicts: Vec<Vec<String>> = Vec::with_capacity(offerings.len());
    let mut short_only: Vec<bool> = Vec::with_capacity(offerings.len());

    for (i, o) in offerings.iter().enumerate() {
        let basic = basic_problems(request, o, now);
        let mut all = basic.clone();
        let short = coverage_shortfall(request, o.covered_minutes());
        if let Some(s) = &short {
            all.push(s.clone());
        }
        if o.upfront_fee > request.budget.max_upfront {
            all.push(format!(
                "upfront fee ${} exceeds the request's max_upfront_usd ${}",
                o.upfront_fee, request.budget.max_upfront
            ));
        }
        if all.is_empty() {
            plans.push((rank_key(request, &[o]), vec![i]));
        }
        // A split partner must pass every check except length; fee is checked on the sum.
        short_only.push(basic.is_empty() && short.is_some() && o.product == Product::CapacityBlock);
        verdicts.push(all);
    }

    if request.allow_split {
        for a in 0..offerings.len() {
            for b in 0..offerings.len() {
                if a == b || !short_only[a] || !short_only[b] {
                    continue;
                }
                let (oa, ob) = (&offerings[a], &offerings[b]);
                let ordered = oa.end() <= ob.start();
                let same = oa.region == ob.region
                    && oa.instance_type == ob.instance_type
                    && oa.instance_count == ob.instance_count;
                let covered = oa.covered_minutes() + ob.covered_minutes();
                let fee = oa.upfront_fee + ob.upfront_fee;
                if ordered
                    && same
                    && covered >= minutes(request)
                    && fee <= request.budget.max_upfront
                {
                    plans.push((rank_key(request, &[oa, ob]), vec![a, b]));
                }
            }
        }
    }

    plans.sort_by(|x, y| x.0.cmp(&y.0));
    let total = plans.len();
    let mut out: Vec<Plan> = plans
        .iter()
        .enumerate()
        .map(|(rank, (_, idx))| {
            let os: Vec<Offering> = idx.iter().map(|&i| offerings[i].clone()).collect();
            build_plan(os, prices, rank, total, request.objective())
        })
        .collect();
    // The objective's trade-off, in words, when the other objective would choose another
    // plan: "earliest: 2 December, $X; cheapest: 15 December, $Y".
    let cheapest = out
        .iter()
        .min_by(|a, b| (a.upfront_fee, a.start).cmp(&(b.upfront_fee, b.start)));
    let earliest = out
        .iter()
        .min_by(|a, b| (a.start, a.upfront_fee).cmp(&(b.start, b.upfront_fee)));
    if let (Some(c), Some(e)) = (cheapest.cloned(), earliest.cloned())
        && (c.start, c.upfront_fee) != (e.start, e.upfront_fee)
        && let Some(best) = out.first_mut()
    {
        let day = |p: &Plan| p.start.format("%-d %B %H:%MZ").to_string();
        best.reason = format!(
            "{}; the trade-off: earliest: {}, ${}; cheapest: {}, ${}",
            best.reason,
            day(&e),
            e.upfront_fee.to_cents(),
            day(&c),
            c.upfront_fee.to_cents()
        );
    }
    if let Some(best) = out.first().cloned() {
        for p in out.iter_mut().skip(1) {
            p.reason = format!(
                "{}; ranks below the chosen plan ({})",
                p.reason,
                compare(p, &best)
            );
        }
    }

    // A reason for every offering that is not part of the chosen plan.
    let chosen: Vec<&str> = out.first().map(|p| p.offering_ids()).unwrap_or_default();
    let mut first_rank: BTreeMap<&str, usize> = BTreeMap::new();
    for (rank, p) in out.iter().enumerate() {
        for id in p.offering_ids() {
            first_rank.entry(id).or_insert(rank);
        }
    }
    let mut rejections = Vec::new();
    for (i, o) in offerings.iter().enumerate() {
        if chosen.contains(&o.id.as_str()) {
            continue;
        }
        let reason = match first_rank.get(o.id.as_str()) {
            Some(&rank) => {
                let p = &out[rank];
                let role = if p.offerings.len() > 1 {
                    "part of a feasible split plan"
                } else {
                    "feasible"
                };
                format!(
                    "{role}, ranked {} of {}: {}",
                    rank + 1,
                    out.len(),
                    compare(p, &out[0])
                )
            }
            None if verdicts[i].is_empty() => "feasible but not chosen".to_string(),
            None => verdicts[i].join("; "),
        };
        rejections.push(Rejection {
            offering_id: o.id.clone(),
            region: o.region.clone(),
            reason,
        });
    }
    Planning {
        plans: out,
        rejections,
    }
}

fn minutes(request: &CapacityRequest) -> i64 {
    i64::from(request.duration_hours) * 60
}

fn coverage_shortfall(request: &CapacityRequest, covered_minutes: i64) -> Option<String> {
    (covered_minutes < minutes(request)).then(|| {
        format!(
            "covers {} of the {} hours needed",
            Decimal::from(covered_minutes) / Decimal::from(60),
            request.duration_hours
        )
    })
}

/// Every check except length and fee.
fn basic_problems(request: &CapacityRequest, o: &Offering, now: DateTime<Utc>) -> Vec<String> {
    let mut why = Vec::new();
    if !request.reservation_products().any(|p| p == o.product) {
        why.push(format!(
            "product {} is not allowed for workload {}",
            o.product,
            request.workload_kind().as_str()
        ));
    }
    if !request.regions.contains(&o.region) {
        why.push(format!("region {} is not one the request allows", o.region));
    }
    if !request.instance_types.contains(&o.instance_type) {
        why.push(format!(
            "instance type {} was not asked for",
            o.instance_type
        ));
    }
    if o.instance_count != request.instance_count {
        why.push(format!(
            "{} instances, the request needs {}",
            o.instance_count, request.instance_count
        ));
    }
    if o.segments.is_empty() || o.segments.iter().any(|s| s.end <= s.start) {
        why.push("has no usable segment".to_string());
        return why;
    }
    if o.segments.len() > 2 {
        why.push(format!(
            "{} segments; at most two are accepted",
            o.segments.len()
        ));
    } else if o.segments.len() == 2 && !request.allow_split {
        why.push("comes in two segments and the request does not allow a split".to_string());
    }
    let w = request.window;
    if o.start() < w.earliest_start || o.end() > w.latest_end {
        why.push(format!(
            "runs {} to {}, outside the window {} to {}",
            o.start().format("%Y-%m-%dT%H:%MZ"),
            o.end().format("%Y-%m-%dT%H:%MZ"),
            w.earliest_start.format("%Y-%m-%dT%H:%MZ"),
            w.latest_end.format("%Y-%m-%dT%H:%MZ"),
        ));
    }
    if o.start() < now + PURCHASE_LEAD {
        why.push(format!(
            "starts at {}, too soon to buy (needs 30 min lead)",
            o.start().format("%Y-%m-%dT%H:%MZ")
        ));
    }
    why
}

fn rank_key(request: &CapacityRequest, os: &[&Offering]) -> RankKey {
    let type_preference = request
        .instance_types
        .iter()
        .position(|t| *t == os[0].instance_type)
        .unwrap_or(usize::MAX);
    RankKey {
        earliest: (request.objective() == Prefer::Earliest).then(|| os[0].start()),
        upfront_fee: os.iter().map(|o| o.upfront_fee).sum(),
        start: os[0].start(),
        segments: os.iter().map(|o| o.segments.len()).sum(),
        type_preference,
        tie_break: os
            .iter()
            .map(|o| format!("{}/{}", o.region, o.id))
            .collect(),
    }
}

/// The ranking key of a built plan, for callers and tests that compare rankings.
pub fn plan_rank_key(request: &CapacityRequest, p: &Plan) -> RankKey {
    let os: Vec<&Offering> = p.offerings.iter().collect();
    rank_key(request, &os)
}

fn build_plan(
    offerings: Vec<Offering>,
    prices: &PriceTable,
    rank: usize,
    total: usize,
    objective: Prefer,
) -> Plan {
    let first = &offerings[0];
    let upfront_fee: Usd = offerings.iter().map(|o| o.upfront_fee).sum();
    let covered_minutes: i64 = offerings.iter().map(Offering::covered_minutes).sum();
    let covered_hours = Decimal::from(covered_minutes) / Decimal::from(60);
    let on_demand_cost = prices
        .on_demand(&first.instance_type)
        .map(|p| Usd::new(p.amount() * covered_hours * Decimal::from(first.instance_count)));
    let saving = on_demand_cost.map(|od| od - upfront_fee);
    let segments: usize = offerings.iter().map(|o| o.segments.len()).sum();
    let what = format!(
        "{} x {} {} in {} from {} for {} h{}: ${} upfront",
        first.instance_count,
        first.instance_type,
        first.product,
        first.region,
        first.start().format("%Y-%m-%dT%H:%MZ"),
        covered_hours.normalize(),
        if segments > 1 {
            format!(" in {segments} segments")
        } else {
            String::new()
        },
        upfront_fee.to_cents(),
    );
    let versus = match (on_demand_cost, saving) {
        (Some(od), Some(s)) if od.is_positive() => format!(
            ", ${} ({}%) below the on-demand ${} for the same instance-hours",
            s.to_cents(),
            (s.amount() * Decimal::from(100) / od.amount()).round_dp(1),
            od.to_cents()
        ),
        _ => ", no on-demand price known to compare".to_string(),
    };
    let reason = if rank == 0 {
        let by = match objective {
            Prefer::Cheapest => "the lowest upfront fee",
            Prefer::Earliest => "the earliest start",
        };
        format!(
            "chosen ({} first): {by} of {total} feasible plan(s); {what}{versus}",
            objective.as_str()
        )
    } else {
        format!("{what}{versus}")
    };
    let end = offerings.last().expect("non-empty").end();
    Plan {
        product: first.product,
        region: first.region.clone(),
        instance_type: first.instance_type.clone(),
        instance_count: first.instance_count,
        upfront_fee,
        start: first.start(),
        end,
        segments,
        covered_hours,
        on_demand_cost,
        saving,
        reason,
        offerings,
    }
}

/// Why `p` ranks below `best`, in words.
fn compare(p: &Plan, best: &Plan) -> String {
    if best.start < p.start && best.upfront_fee > p.upfront_fee {
        return format!(
            "starts later ({} vs {}) though it costs less (${} vs ${})",
            p.start.format("%Y-%m-%dT%H:%MZ"),
            best.start.format("%Y-%m-%dT%H:%MZ"),
            p.upfront_fee.to_cents(),
            best.upfront_fee.to_cents()
        );
    }
    match p.upfront_fee.cmp(&best.upfront_fee) {
        Ordering::Greater => format!(
            "costs ${} vs ${} for the chosen plan",
            p.upfront_fee.to_cents(),
            best.upfront_fee.to_cents()
        ),
        _ if p.start > best.start => "same fee, later start".to_string(),
        _ if p.segments > best.segments => "same fee and start, more segments".to_string(),
        _ => "same fee, start and segments; a less preferred type or a later tie-break".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeDelta, Utc};

    use super::within_block_limit;
    use crate::domain::catalog::PriceTable;
    use crate::domain::money::Usd;
    use crate::domain::offering::{Offering, Product, Segment};
    use crate::domain::reservation::{Reservation, ReservationState};

    fn day(from: DateTime<Utc>) -> Vec<Segment> {
        vec![Segment {
            start: from,
            end: from + TimeDelta::days(1),
            availability_zone: Some("us-east-1a".into()),
        }]
    }

    fn block(id: &str, count: u32, from: DateTime<Utc>, state: ReservationState) -> Reservation {
        Reservation {
            id: id.into(),
            product: Product::CapacityBlock,
            region: "us-west-2".into(),
            instance_type: "p5.48xlarge".into(),
            instance_count: count,
            segments: day(from),
            upfront_fee: Usd::ZERO,
            state,
            offering_id: None,
            request_tag: None,
            ultraserver: false,
            bought_at: None,
            debit_month: None,
            debit_team: None,
            payment_check_at: None,
            extensions: Vec::new(),
            extension_check_at: None,
            deployment_tag: None,
        }
    }

    #[test]
    fn a_block_that_would_pass_the_accounts_limit_with_the_blocks_overlapping_it_is_rejected() {
        let t0: DateTime<Utc> = "2026-12-10T11:30:00Z".parse().unwrap();
        let d = TimeDelta::days(1);
        // GIVEN 200 instances held over day 0 in another region (two blocks, one of another
        // buyer), 64 over day 2, and an expired block of 64 over day 0
        let live = [
            block("cr-a", 136, t0, ReservationState::Active),
            block("cr-b", 64, t0, ReservationState::Scheduled),
            block("cr-c", 64, t0 + d * 2, ReservationState::Scheduled),
            block("cr-old", 64, t0, ReservationState::Expired),
        ];
        let prices = PriceTable::default();
        let offer = |id: &str, count: u32, from: DateTime<Utc>| {
            Offering::new(
                id,
                Product::CapacityBlock,
                "us-east-1",
                "p5.48xlarge",
                count,
                day(from),
                Usd::parse("1000").unwrap(),
                &prices,
            )
        };
        let offerings = [
            offer("cb-56", 56, t0),
            offer("cb-57", 57, t0),
            offer("cb-day1", 64, t0 + d),
        ];
        // WHEN the limit of 256 is applied
        let (usable, over) = within_block_limit(&offerings, &live, 256);
        // THEN 200 + 56 fits, 200 + 57 does not, and a day nothing overlaps is free
        let ids: Vec<&str> = usable.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["cb-56", "cb-day1"]);
        assert_eq!(over.len(), 1);
        assert_eq!(over[0].offering_id, "cb-57");
        assert!(
            over[0]
                .reason
                .contains("holds 200 instances in 2 Capacity Block(s)")
                && over[0].reason.contains("MAX_BLOCK_INSTANCES"),
            "{}",
            over[0].reason
        );
    }
}
