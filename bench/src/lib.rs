//! The planner benchmark's world: a market of Capacity Block offerings and requests over it,
//! generated from a seed, and one search-offerings tick's planning of every request against
//! what its queries return (`make bench`; the answers are found before the timing starts, as
//! AWS would have returned them).

use capacity_pilot::domain::catalog::{PriceTable, SupportedInstanceTypes};
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::offering::{Offering, Product, Segment};
use capacity_pilot::domain::planner::{Planning, plan};
use capacity_pilot::domain::request::{CapacityRequest, ValidationContext, parse_request};
use capacity_pilot::ports::OfferingQuery;
use chrono::{DateTime, Duration, TimeZone, Utc};
use rust_decimal::Decimal;
use serde_json::json;

const REGIONS: [&str; 3] = ["us-east-1", "us-east-2", "us-west-2"];
const TYPES: [&str; 4] = [
    "p5.48xlarge",
    "p4d.24xlarge",
    "p5e.48xlarge",
    "trn1.32xlarge",
];
const COUNTS: [u32; 4] = [1, 2, 4, 8];
/// Capacity Block lengths AWS sells: 1-14 days, then weeks.
const DAYS: [u32; 6] = [1, 2, 3, 4, 7, 14];

/// A splitmix64 stream: the benchmark's only randomness, so every run plans the same world.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// The moment the benchmark's tick runs.
pub fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0)
        .single()
        .expect("a valid date")
}

/// `n` Capacity Block offerings over three regions, four types, four counts and six lengths,
/// starting at 11:30 UTC on one of the next 56 days, priced at 0.8-1.2 times on demand.
pub fn market(n: usize, seed: u64) -> Vec<Offering> {
    let prices = PriceTable::default();
    let mut d = Draws(seed);
    (0..n)
        .map(|i| {
            let instance_type = d.pick(&TYPES);
            let count = d.pick(&COUNTS);
            let days = d.pick(&DAYS);
            let start = now().date_naive().and_hms_opt(11, 30, 0).unwrap().and_utc()
                + Duration::days(1 + d.below(56) as i64);
            let hours = Decimal::from(days * 24 * count);
            let hourly = prices
                .on_demand(instance_type)
                .expect("a listed type")
                .amount();
            let factor = Decimal::new(80 + d.below(41) as i64, 2);
            Offering::new(
                format!("cb-{i:017x}"),
                Product::CapacityBlock,
                d.pick(&REGIONS),
                instance_type,
                count,
                vec![Segment {
                    start,
                    end: start + Duration::hours(i64::from(days) * 24),
                    availability_zone: None,
                }],
                Usd::new((hourly * hours * factor).round_dp(2)),
                &prices,
            )
        })
        .collect()
}

/// `n` requests: one or two types, one to three regions, a count, a length, a window of one
/// to six weeks (and a day longer than the length) within the market's eight, half of them allowed to split. Each is written as a
/// caller sends it (the event's `detail`) and parsed by the product's own validation, so the
/// benchmark needs none of the test fakes.
pub fn requests(n: usize, seed: u64) -> Vec<CapacityRequest> {
    let mut d = Draws(seed ^ 0x5EED);
    let instance_types = SupportedInstanceTypes::default();
    let allowed_regions: Vec<String> = REGIONS.iter().map(|s| s.to_string()).collect();
    let ctx = ValidationContext {
        now: now(),
        instance_types: &instance_types,
        allowed_regions: &allowed_regions,
    };
    (0..n)
        .map(|i| {
            let mut types: Vec<&str> = (0..1 + d.below(2)).map(|_| d.pick(&TYPES)).collect();
            types.dedup();
            let regions = &REGIONS[..1 + d.below(3)];
            let count = d.pick(&COUNTS);
            let hours = d.pick(&DAYS) * 24;
            let split = d.below(2) == 0;
            let earliest = now() + Duration::days(d.below(14) as i64);
            // a window at least a day longer than the reservation, as the validation asks
            let latest = earliest
                + Duration::weeks(1 + d.below(6) as i64)
                    .max(Duration::hours(i64::from(hours) + 24));
            let detail = json!({
                "schema_version": 1,
                "request_id": format!("bench-{i}"),
                "team": "team-a",
                "instance_types": types,
                "instance_count": count,
                "duration_hours": hours,
                "earliest_start": earliest.to_rfc3339(),
                "latest_end": latest.to_rfc3339(),
                "regions": regions,
                "allow_split": split,
                "strategy": "reserve",
                "budget": {"max_upfront_usd": "1000000"},
                "workload": {
                    "kind": "ec2-instances",
                    "launch_template": {"name": "capacity-pilot-gpu"},
                    "subnet_ids": ["subnet-0123456789abcdef0"],
                },
            });
            parse_request(&detail, &ctx)
                .unwrap_or_else(|e| panic!("benchmark request {i} is invalid: {e:?}"))
        })
        .collect()
}

/// What AWS returns for `q`: the offerings of its product, region, type, count and length
/// that start and end within its bounds.
pub fn answer(market: &[Offering], q: &OfferingQuery) -> Vec<Offering> {
    market
        .iter()
        .filter(|o| {
            o.product == q.product
                && o.region == q.region
                && o.instance_type == q.instance_type
                && o.instance_count == q.instance_count
                && o.segments
                    .iter()
                    .map(Segment::duration_minutes)
                    .sum::<i64>()
                    == i64::from(q.duration_hours) * 60
                && o.start() >= q.start_from
                && o.end() <= q.end_by
        })
        .cloned()
        .collect()
}

/// Each request with the offerings its queries return (search-offerings' `queries_for`).
pub fn answered(
    market: &[Offering],
    requests: Vec<CapacityRequest>,
) -> Vec<(CapacityRequest, Vec<Offering>)> {
    requests
        .into_iter()
        .map(|r| {
            let offerings = search_offerings::handler::queries_for(&r, now())
                .iter()
                .flat_map(|q| answer(market, q))
                .collect();
            (r, offerings)
        })
        .collect()
}

/// One tick's planning: every request planned against its answers.
pub fn tick(answered: &[(CapacityRequest, Vec<Offering>)], prices: &PriceTable) -> Vec<Planning> {
    answered
        .iter()
        .map(|(r, offerings)| plan(r, offerings, prices, now()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_world_is_the_same_every_run_and_its_requests_find_and_plan_offerings() {
        let m = market(2_000, 7);
        assert_eq!(m.len(), 2_000);
        assert_eq!(
            m.iter().map(|o| (&o.id, o.upfront_fee)).collect::<Vec<_>>(),
            market(2_000, 7)
                .iter()
                .map(|o| (&o.id, o.upfront_fee))
                .collect::<Vec<_>>()
        );
        let a = answered(&m, requests(200, 7));
        let found = a.iter().filter(|(_, o)| !o.is_empty()).count();
        assert!(found > 20, "only {found} of 200 requests found offerings");
        let planned = tick(&a, &PriceTable::default())
            .iter()
            .filter(|p| !p.plans.is_empty())
            .count();
        assert!(planned > 0, "no request got a plan");
        // an answer is what its query asks, and nothing else
        for (r, offerings) in &a {
            for o in offerings {
                assert!(r.instance_types.contains(&o.instance_type), "{o:?}");
                assert!(r.regions.contains(&o.region), "{o:?}");
                assert_eq!(o.instance_count, r.instance_count);
            }
        }
    }
}
