//! Property tests: whatever the seed, the clock and the search, every generated offering obeys
//! AWS's rules for Capacity Blocks and training plans.

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use local_cloud::market::{BlockSearch, Market, PLAN_COUNTS, PlanSearch, valid_block_hours};
use proptest::prelude::*;

fn block_hours() -> impl Strategy<Value = i64> {
    prop_oneof![
        (1i64..=14).prop_map(|d| d * 24),
        (3i64..=26).prop_map(|w| w * 7 * 24)
    ]
}

fn clock() -> impl Strategy<Value = DateTime<Utc>> {
    // any minute within two years from 2026-01-01
    (0i64..(2 * 365 * 24 * 60)).prop_map(|m| {
        "2026-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::minutes(m)
    })
}

const BLOCK_TYPES: [&str; 4] = [
    "p5.48xlarge",
    "p4d.24xlarge",
    "trn1.32xlarge",
    "p6-b200.48xlarge",
];
const PLAN_TYPES: [&str; 3] = ["ml.p5.48xlarge", "ml.trn2.48xlarge", "ml.p4d.24xlarge"];
const TARGETS: [&str; 3] = ["training-job", "hyperpod-cluster", "endpoint"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_capacity_block_offering_obeys_the_block_rules(
        seed in any::<u64>(),
        now in clock(),
        ty in 0usize..BLOCK_TYPES.len(),
        count in 1i64..=64,
        hours in block_hours(),
        range_start_days in proptest::option::of(0i64..70),
        range_len_days in proptest::option::of(1i64..60),
    ) {
        let market = Market::new(seed);
        let start_range = range_start_days.map(|d| now + TimeDelta::days(d));
        let end_range = range_len_days.map(|d| start_range.unwrap_or(now) + TimeDelta::days(d) + TimeDelta::hours(hours / 24 * 24));
        let q = BlockSearch {
            region: "us-east-1".into(),
            instance_type: BLOCK_TYPES[ty].into(),
            instance_count: count,
            duration_hours: hours,
            start_range,
            end_range,
        };
        let offers = market.search_blocks(now, &q).unwrap();
        prop_assert!(offers.len() <= 6);
        for o in &offers {
            // ends at 11:30 UTC
            prop_assert_eq!((o.end.hour(), o.end.minute(), o.end.second()), (11, 30, 0));
            // starts 30 minutes to 8 weeks ahead, inside the requested range
            prop_assert!(o.start >= now + TimeDelta::minutes(30));
            prop_assert!(o.start <= now + TimeDelta::days(56));
            if let Some(s) = start_range { prop_assert!(o.start >= s); }
            if let Some(e) = end_range { prop_assert!(o.end <= e); }
            // whole days of a valid block duration, plus at most a partial first day
            let first_1130 = local_cloud::util::next_1130_after(o.start - TimeDelta::seconds(1));
            let whole = (o.end - first_1130).num_hours();
            // (none at all: a block of only the partial first day, shorter than any asked)
            prop_assert!(whole == 0 || valid_block_hours(whole), "whole-day part {whole}h");
            prop_assert!(first_1130 - o.start < TimeDelta::hours(24));
            prop_assert_eq!(o.duration_hours() * 60 + o.duration_minutes(), (o.end - o.start).num_minutes());
            // the requested count, up to 64, priced
            prop_assert_eq!(o.instance_count, count);
            prop_assert!(o.upfront_fee > rust_decimal::Decimal::ZERO);
            prop_assert!(o.availability_zone.starts_with("us-east-1"));
            // capacity really is free for it
            let free = market.free_between(local_cloud::market::Pool::CapacityBlock, "us-east-1", &o.availability_zone, &o.instance_type, o.start, o.end);
            prop_assert!(i64::from(free) >= count);
        }
        // the cheapest of the requested duration comes first (then the earliest blocks, of
        // every length, then the rest)
        let requested: Vec<_> = offers.iter().filter(|o| {
            let first_1130 = local_cloud::util::next_1130_after(o.start - TimeDelta::seconds(1));
            (o.end - first_1130).num_hours() == hours
        }).collect();
        if !requested.is_empty() {
            prop_assert!(requested.iter().any(|o| o.id == offers[0].id));
            prop_assert!(requested.iter().all(|o| offers[0].hourly_usd <= o.hourly_usd));
        }
    }

    #[test]
    fn every_training_plan_offering_obeys_the_plan_rules(
        seed in any::<u64>(),
        now in clock(),
        ty in 0usize..PLAN_TYPES.len(),
        count_i in 0usize..PLAN_COUNTS.len(),
        days in 1i64..=30,
        target in 0usize..TARGETS.len(),
        after_days in proptest::option::of(0i64..40),
    ) {
        let market = Market::new(seed);
        let start_after = after_days.map(|d| now + TimeDelta::days(d));
        let q = PlanSearch {
            region: "us-west-2".into(),
            instance_type: PLAN_TYPES[ty].into(),
            instance_count: PLAN_COUNTS[count_i],
            duration_hours: days * 24,
            start_after,
            end_before: None,
            target: TARGETS[target].into(),
        };
        let offers = market.search_plans(now, &q).unwrap();
        prop_assert!(offers.len() <= 3);
        let contiguous = offers.iter().any(|o| o.segments.len() == 1);
        for o in &offers {
            prop_assert!(o.segments.len() == 1 || o.segments.len() == 2);
            // contiguous blocks first, splits only when no contiguous block exists
            if contiguous { prop_assert_eq!(o.segments.len(), 1); }
            // the days asked, or (aws-reference §11.2) the partial first day plus the days
            // asked or a day less
            let partial = o.start() != local_cloud::util::next_1130_after(o.start() - TimeDelta::seconds(1));
            if partial {
                let whole = o.total_minutes() - o.segments[0].minutes() + (o.segments[0].end - local_cloud::util::next_1130_after(o.start())).num_minutes();
                prop_assert!(whole == days * 24 * 60 || whole == (days - 1) * 24 * 60, "{whole}");
                prop_assert_eq!(o.segments.len(), 1);
            } else {
                prop_assert_eq!(o.total_hours(), days * 24);
            }
            prop_assert!(PLAN_COUNTS.contains(&o.instance_count));
            prop_assert!(o.start() >= now + TimeDelta::minutes(30));
            prop_assert!(o.start() <= now + TimeDelta::days(56));
            if let Some(a) = start_after { prop_assert!(o.start() >= a); }
            for s in &o.segments {
                prop_assert_eq!((s.end.hour(), s.end.minute()), (11, 30));
                prop_assert!(partial || (s.hours() % 24 == 0 && s.hours() >= 24));
            }
            if o.segments.len() == 2 {
                prop_assert!(o.segments[0].end <= o.segments[1].start);
            }
            if q.target != "training-job" {
                prop_assert!(o.segments.iter().all(|s| s.availability_zone == o.segments[0].availability_zone));
            }
            prop_assert!(o.upfront_fee > rust_decimal::Decimal::ZERO);
        }
    }

    #[test]
    fn the_same_seed_always_gives_the_same_offerings(seed in any::<u64>(), now in clock()) {
        let q = BlockSearch {
            region: "us-east-2".into(),
            instance_type: "p5.48xlarge".into(),
            instance_count: 4,
            duration_hours: 48,
            start_range: None,
            end_range: None,
        };
        let a = Market::new(seed).search_blocks(now, &q).unwrap();
        let b = Market::new(seed).search_blocks(now, &q).unwrap();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn block_durations_are_one_to_fourteen_days_then_weeks_to_182_days() {
    let valid: Vec<i64> = (1..=200).filter(|d| valid_block_hours(d * 24)).collect();
    let expected: Vec<i64> = (1..=14).chain((21..=182).step_by(7)).collect();
    assert_eq!(valid, expected);
    assert!(!valid_block_hours(36));
}
