//! Capacity Blocks over EC2's query protocol: offerings, purchase, reservation lifecycle and its
//! events, extensions, and the error codes a consumer matches on.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    CapacityBlockOffering, CapacityReservation, CapacityReservationInstancePlatform, Filter,
    ResourceType, Tag, TagSpecification,
};
use chrono::{TimeDelta, Timelike};
use local_cloud::{Options, Settings};

use crate::helpers::*;

pub async fn offerings(env: &Env, ty: &str, count: i32, hours: i32) -> Vec<CapacityBlockOffering> {
    env.ec2
        .describe_capacity_block_offerings()
        .instance_type(ty)
        .instance_count(count)
        .capacity_duration_hours(hours)
        .send()
        .await
        .expect("offerings")
        .capacity_block_offerings()
        .to_vec()
}

pub async fn buy(
    env: &Env,
    offering: &CapacityBlockOffering,
    request: &str,
) -> CapacityReservation {
    env.ec2
        .purchase_capacity_block()
        .capacity_block_offering_id(offering.capacity_block_offering_id().unwrap())
        .instance_platform(CapacityReservationInstancePlatform::LinuxUnix)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::CapacityReservation)
                .tags(
                    Tag::builder()
                        .key("capacity-pilot:request-id")
                        .value(request)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .expect("purchase")
        .capacity_reservation()
        .cloned()
        .expect("reservation in the response")
}

pub async fn describe(env: &Env, cr: &str) -> CapacityReservation {
    env.ec2
        .describe_capacity_reservations()
        .capacity_reservation_ids(cr)
        .send()
        .await
        .expect("describe")
        .capacity_reservations()[0]
        .clone()
}

#[tokio::test]
async fn offerings_report_every_field_a_planner_reads_and_obey_the_block_rules() {
    let env = env().await;
    let offers = offerings(&env, "p5.48xlarge", 4, 48).await;
    assert!(!offers.is_empty() && offers.len() <= 6, "{}", offers.len());
    for o in &offers {
        assert!(o.capacity_block_offering_id().unwrap().starts_with("cb-"));
        assert_eq!(o.instance_type(), Some("p5.48xlarge"));
        assert!(o.availability_zone().unwrap().starts_with("us-east-1"));
        assert_eq!(o.instance_count(), Some(4));
        let start = chrono_of(o.start_date().unwrap());
        let end = chrono_of(o.end_date().unwrap());
        assert_eq!(
            (end.hour(), end.minute()),
            (11, 30),
            "blocks end at 11:30 UTC"
        );
        assert!(start >= t0() + TimeDelta::minutes(30));
        let minutes = i64::from(o.capacity_block_duration_hours().unwrap()) * 60
            + i64::from(o.capacity_block_duration_minutes().unwrap());
        assert_eq!(minutes, (end - start).num_minutes());
        let fee: rust_decimal::Decimal = o.upfront_fee().unwrap().parse().unwrap();
        assert!(fee > rust_decimal::Decimal::ZERO);
        assert_eq!(o.currency_code(), Some("USD"));
        assert_eq!(o.tenancy().unwrap().as_str(), "default");
    }
    // the requested duration comes first and is priced near the list price ($34.608/h)
    let first = &offers[0];
    let fee: rust_decimal::Decimal = first.upfront_fee().unwrap().parse().unwrap();
    let hours = i64::from(first.capacity_block_duration_hours().unwrap());
    let hourly = fee / rust_decimal::Decimal::from(4 * hours);
    assert!(
        hourly > "31".parse().unwrap() && hourly < "38.1".parse().unwrap(),
        "{hourly}"
    );
}

#[tokio::test]
async fn offerings_respect_the_date_range_and_paginate() {
    // Paging makes more calls than the describe limit's burst allows; the limit has its own
    // test.
    let env = env_with(Options {
        seed: 42,
        start: Some(t0()),
        settings: Settings {
            describe_limit_burst: 0,
            ..Settings::default()
        },
        ..Options::default()
    })
    .await;
    let start = at("2026-09-10T00:00:00Z");
    let end = at("2026-09-20T00:00:00Z");
    let all = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(2)
        .capacity_duration_hours(72)
        .start_date_range(smithy_of(start))
        .end_date_range(smithy_of(end))
        .send()
        .await
        .unwrap();
    let all = all.capacity_block_offerings().to_vec();
    assert!(all.len() >= 2, "seed 42 has several offerings in the range");
    for o in &all {
        assert!(chrono_of(o.start_date().unwrap()) >= start);
        assert!(chrono_of(o.end_date().unwrap()) <= end);
    }
    let mut paged = Vec::new();
    let mut token = None;
    loop {
        let page = env
            .ec2
            .describe_capacity_block_offerings()
            .instance_type("p5.48xlarge")
            .instance_count(2)
            .capacity_duration_hours(72)
            .start_date_range(smithy_of(start))
            .end_date_range(smithy_of(end))
            .max_results(1)
            .set_next_token(token)
            .send()
            .await
            .unwrap();
        assert!(page.capacity_block_offerings().len() <= 1);
        paged.extend(page.capacity_block_offerings().to_vec());
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    assert_eq!(paged, all);
}

#[tokio::test]
async fn invalid_searches_get_ec2_error_codes() {
    let env = env().await;
    let err = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .capacity_duration_hours(25)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    let err = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("MissingParameter"));
    let err = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(65)
        .capacity_duration_hours(24)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    // 15 days is not a block duration; 21 is
    let err = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .capacity_duration_hours(15 * 24)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert!(!offerings(&env, "p5.48xlarge", 1, 21 * 24).await.is_empty());
}

#[tokio::test]
async fn purchase_errors_name_the_offering_problem() {
    let env = env().await;
    let purchase = |id: &str| {
        env.ec2
            .purchase_capacity_block()
            .capacity_block_offering_id(id)
            .instance_platform(CapacityReservationInstancePlatform::LinuxUnix)
            .send()
    };
    let err = purchase("cb-0123456789abcdef0").await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidCapacityBlockOfferingIdNotFound"));
    let err = purchase("not-an-offering").await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidCapacityBlockOfferingIdMalformed"));
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let err = env
        .ec2
        .purchase_capacity_block()
        .capacity_block_offering_id(offer.capacity_block_offering_id().unwrap())
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("MissingParameter"),
        "InstancePlatform is required"
    );
    assert!(err.message().unwrap().contains("InstancePlatform"));
}

#[tokio::test]
async fn a_block_goes_from_pending_to_expired_with_its_events_on_time() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 2, 48).await.remove(0);
    let cr = buy(&env, &offer, "req-1").await;
    let id = cr.capacity_reservation_id().unwrap().to_string();
    assert!(id.starts_with("cr-") && id.len() == 20);
    // a fresh block has been seen in `pending` (aws-reference §11.1 States)
    assert_eq!(cr.state().unwrap().as_str(), "pending");
    // Before the block is active its totals read 0, and EC2's tag carries the count it will
    // have (aws-reference §11.1)
    assert_eq!(cr.total_instance_count(), Some(0));
    assert_eq!(cr.available_instance_count(), Some(0));
    let quantity = |cr: &CapacityReservation| {
        cr.tags()
            .iter()
            .find(|t| t.key() == Some("aws:ec2capacityreservation:incrementalRequestedQuantity"))
            .and_then(|t| t.value().map(str::to_string))
    };
    assert_eq!(quantity(&cr).as_deref(), Some("2"));
    assert_eq!(cr.reservation_type().unwrap().as_str(), "capacity-block");
    assert_eq!(cr.instance_match_criteria().unwrap().as_str(), "targeted");
    assert!(cr.capacity_block_id().is_some());
    assert_eq!(
        cr.tags()
            .iter()
            .find(|t| t.key() == Some("capacity-pilot:request-id"))
            .and_then(|t| t.value()),
        Some("req-1")
    );
    let start = chrono_of(offer.start_date().unwrap());
    let end = chrono_of(offer.end_date().unwrap());
    assert_eq!(chrono_of(cr.start_date().unwrap()), start);
    assert_eq!(chrono_of(cr.end_date().unwrap()), end);

    // once the listing lag has passed, the purchase is found again by its tag (how a purchase
    // is reconciled after a crash), still waiting for its payment
    env.cloud.step(TimeDelta::minutes(2));
    let by_tag = env
        .ec2
        .describe_capacity_reservations()
        .filters(
            Filter::builder()
                .name("tag:capacity-pilot:request-id")
                .values("req-1")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(by_tag.capacity_reservations().len(), 1);
    assert_eq!(
        by_tag.capacity_reservations()[0].state().unwrap().as_str(),
        "pending"
    );

    env.cloud.step(TimeDelta::minutes(3));
    let scheduled = describe(&env, &id).await;
    assert_eq!(scheduled.state().unwrap().as_str(), "scheduled");
    assert_eq!(scheduled.total_instance_count(), Some(0));
    assert_eq!(quantity(&scheduled).as_deref(), Some("2"));
    assert!(events_of(&env.cloud, "Capacity Block Delivered").is_empty());

    // the runner can step straight to the activation, which lags the start (ARCHITECTURE
    // §8.10: 5 min)
    assert_eq!(
        env.cloud.next_transition(),
        Some(start + TimeDelta::minutes(5))
    );
    env.cloud.step_to_next();
    let active = describe(&env, &id).await;
    assert_eq!(active.state().unwrap().as_str(), "active");
    assert_eq!(active.total_instance_count(), Some(2));
    assert_eq!(active.available_instance_count(), Some(2));
    let delivered = events_of(&env.cloud, "Capacity Block Delivered");
    assert_eq!(delivered.len(), 1);
    let ev = &delivered[0];
    assert_eq!(ev["source"], "aws.ec2");
    assert_eq!(ev["version"], "0");
    assert_eq!(ev["account"], "123456789012");
    assert_eq!(ev["region"], "us-east-1");
    let activated = start + TimeDelta::minutes(5);
    assert_eq!(
        ev["time"],
        activated.format("%Y-%m-%dT%H:%M:%SZ").to_string()
    );
    assert_eq!(ev["detail"]["capacity-reservation-id"], id.as_str());
    assert_eq!(
        ev["detail"]["end-date"],
        end.format("%Y-%m-%dT%H:%M:%SZ").to_string()
    );
    assert_eq!(
        ev["resources"][0],
        format!("arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{id}")
    );

    env.cloud.advance_to(end - TimeDelta::minutes(41));
    assert!(events_of(&env.cloud, "Capacity Block Expiration Warning").is_empty());
    env.cloud.advance_to(end - TimeDelta::minutes(40));
    let warn = events_of(&env.cloud, "Capacity Block Expiration Warning");
    assert_eq!(warn.len(), 1);
    assert_eq!(
        warn[0]["time"],
        (end - TimeDelta::minutes(40))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    );
    env.cloud.advance_to(end);
    assert_eq!(
        describe(&env, &id).await.state().unwrap().as_str(),
        "expired"
    );
}

#[tokio::test]
async fn the_alternative_event_spelling_can_be_selected() {
    let mut options = Options {
        seed: 42,
        start: Some(t0()),
        ..Options::default()
    };
    options.settings.reservation_event_names = true;
    let env = env_with(options).await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    buy(&env, &offer, "req-spelling").await;
    env.cloud.advance_to(chrono_of(offer.end_date().unwrap()));
    assert_eq!(
        events_of(&env.cloud, "Capacity Block Reservation Delivered").len(),
        1
    );
    assert_eq!(
        events_of(&env.cloud, "Capacity Block Reservation Expiration Warning").len(),
        1
    );
    assert!(events_of(&env.cloud, "Capacity Block Delivered").is_empty());
}

#[tokio::test]
async fn an_offering_can_be_bought_twice_by_default_and_once_when_single_use() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let a = buy(&env, &offer, "dup").await;
    let b = buy(&env, &offer, "dup").await;
    assert_ne!(a.capacity_reservation_id(), b.capacity_reservation_id());

    env.cloud
        .with_world(|w| w.settings.single_use_offerings = true);
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    buy(&env, &offer, "once").await;
    let err = env
        .ec2
        .purchase_capacity_block()
        .capacity_block_offering_id(offer.capacity_block_offering_id().unwrap())
        .instance_platform(CapacityReservationInstancePlatform::LinuxUnix)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidCapacityBlockOfferingIdExpired"));
}

#[tokio::test]
async fn buying_consumes_capacity_until_the_offering_is_gone() {
    let env = env().await;
    // find the first offering, then buy it until the zone-day has no capacity left
    let offer = offerings(&env, "p5.48xlarge", 8, 24).await.remove(0);
    let mut bought = 0;
    let err = loop {
        match env
            .ec2
            .purchase_capacity_block()
            .capacity_block_offering_id(offer.capacity_block_offering_id().unwrap())
            .instance_platform(CapacityReservationInstancePlatform::LinuxUnix)
            .send()
            .await
        {
            Ok(_) => bought += 1,
            Err(e) => break e,
        }
        assert!(bought < 20, "capacity is finite");
    };
    assert!(bought >= 1);
    assert_eq!(err.code(), Some("InvalidCapacityBlockOfferingIdExpired"));
}

#[tokio::test]
async fn an_injected_payment_failure_releases_the_block() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "unpaid").await;
    let id = cr.capacity_reservation_id().unwrap();
    let (status, _) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/capacity-reservations/{id}/fail-payment"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    env.cloud.step(TimeDelta::minutes(10));
    assert_eq!(
        describe(&env, id).await.state().unwrap().as_str(),
        "payment-failed"
    );
    env.cloud.advance_to(chrono_of(offer.end_date().unwrap()));
    assert!(events_of(&env.cloud, "Capacity Block Delivered").is_empty());
}

#[tokio::test]
async fn capacity_blocks_and_reservations_filter_by_state_and_zone() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "filters").await;
    // past the listing lag, before the payment clears
    env.cloud.step(TimeDelta::minutes(2));
    let blocks = env.ec2.describe_capacity_blocks().send().await.unwrap();
    let block = &blocks.capacity_blocks()[0];
    assert_eq!(block.capacity_block_id(), cr.capacity_block_id());
    assert_eq!(
        block.capacity_reservation_ids(),
        [cr.capacity_reservation_id().unwrap()]
    );
    assert_eq!(block.availability_zone(), offer.availability_zone());
    // the block resource's states have no `pending`: a pending reservation's block reads
    // `payment-pending`, and its state filter matches that
    assert_eq!(block.state().unwrap().as_str(), "payment-pending");
    let by_state = env
        .ec2
        .describe_capacity_blocks()
        .filters(
            Filter::builder()
                .name("state")
                .values("payment-pending")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(by_state.capacity_blocks().len(), 1);
    let none = env
        .ec2
        .describe_capacity_reservations()
        .filters(Filter::builder().name("state").values("active").build())
        .send()
        .await
        .unwrap();
    assert!(none.capacity_reservations().is_empty());
    let some = env
        .ec2
        .describe_capacity_reservations()
        .filters(Filter::builder().name("state").values("pending").build())
        .filters(
            Filter::builder()
                .name("availability-zone")
                .values(offer.availability_zone().unwrap())
                .build(),
        )
        .filters(
            Filter::builder()
                .name("instance-type")
                .values("p5.48xlarge")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(some.capacity_reservations().len(), 1);
    let err = env
        .ec2
        .describe_capacity_reservations()
        .capacity_reservation_ids("cr-00000000000000000")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidCapacityReservationId.NotFound"));
    // reservations are regional
    let other = sdk_config(&env.cloud.url(), "us-west-2", false).await;
    let west = aws_sdk_ec2::Client::new(&other);
    let out = west.describe_capacity_reservations().send().await.unwrap();
    assert!(out.capacity_reservations().is_empty());
}

#[tokio::test]
async fn an_undocumented_tag_filter_can_be_refused() {
    let mut options = Options {
        seed: 42,
        start: Some(t0()),
        ..Options::default()
    };
    options.settings.listing_lag_seconds = 0;
    options.settings.refuse_tag_filters = true;
    let env = env_with(options).await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    buy(&env, &offer, "tagged").await;
    let err = env
        .ec2
        .describe_capacity_reservations()
        .filters(
            Filter::builder()
                .name("tag:capacity-pilot:request-id")
                .values("tagged")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert!(
        err.message()
            .unwrap()
            .contains("'tag:capacity-pilot:request-id'"),
        "{err:?}"
    );
    // documented filters still answer
    let by_state = env
        .ec2
        .describe_capacity_reservations()
        .filters(Filter::builder().name("state").values("pending").build())
        .send()
        .await
        .unwrap();
    assert_eq!(by_state.capacity_reservations().len(), 1);
}

#[tokio::test]
async fn an_extension_moves_the_end_and_the_warning_after_payment() {
    // the reading where the warning follows the end (by default the old end's warning is
    // still sent: extensions_by_hand::by_default_the_old_ends_warning_still_comes_...)
    let env = env_with_settings(Settings {
        warning_follows_extension: true,
        ..Settings::default()
    })
    .await;
    let offer = offerings(&env, "p5.48xlarge", 1, 48).await.remove(0);
    let cr = buy(&env, &offer, "extend").await;
    let id = cr.capacity_reservation_id().unwrap().to_string();
    let end = chrono_of(offer.end_date().unwrap());
    env.cloud.step(TimeDelta::minutes(5));
    let ext = env
        .ec2
        .describe_capacity_block_extension_offerings()
        .capacity_reservation_id(&id)
        .capacity_block_extension_duration_hours(24)
        .send()
        .await
        .unwrap();
    let Some(o) = ext.capacity_block_extension_offerings().first() else {
        panic!("seed 42 has capacity for a one-day extension");
    };
    assert_eq!(
        chrono_of(o.capacity_block_extension_start_date().unwrap()),
        end
    );
    let new_end = chrono_of(o.capacity_block_extension_end_date().unwrap());
    assert_eq!(new_end, end + TimeDelta::hours(24));
    assert_eq!(o.capacity_block_extension_duration_hours(), Some(24));
    assert!(o.upfront_fee().is_some());
    let bought = env
        .ec2
        .purchase_capacity_block_extension()
        .capacity_block_extension_offering_id(o.capacity_block_extension_offering_id().unwrap())
        .capacity_reservation_id(&id)
        .send()
        .await
        .unwrap();
    let e = &bought.capacity_block_extensions()[0];
    assert_eq!(
        e.capacity_block_extension_status().unwrap().as_str(),
        "payment-pending"
    );
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        end
    );
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        new_end
    );
    env.cloud.advance_to(new_end);
    let warnings = events_of(&env.cloud, "Capacity Block Expiration Warning");
    assert_eq!(warnings.len(), 1, "only the extended end warns");
    assert_eq!(
        warnings[0]["time"],
        (new_end - TimeDelta::minutes(40))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    );
    let bad = env
        .ec2
        .describe_capacity_block_extension_offerings()
        .capacity_reservation_id(&id)
        .capacity_block_extension_duration_hours(25)
        .send()
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Some("InvalidParameterValue"));
}

#[tokio::test]
async fn ultraserver_blocks_warn_70_minutes_before_the_end() {
    let env = env().await;
    let offer = offerings(&env, "p6e-gb200.36xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "ultra").await;
    let end = chrono_of(offer.end_date().unwrap());
    env.cloud.advance_to(end - TimeDelta::minutes(71));
    assert!(events_of(&env.cloud, "Capacity Block Expiration Warning").is_empty());
    env.cloud.advance_to(end - TimeDelta::minutes(70));
    let warn = events_of(&env.cloud, "Capacity Block Expiration Warning");
    assert_eq!(warn.len(), 1);
    assert_eq!(
        warn[0]["detail"]["capacity-reservation-id"],
        cr.capacity_reservation_id().unwrap()
    );
}

#[tokio::test]
async fn an_ultraserver_block_says_its_type_and_its_reservation_names_the_instance_type() {
    // the reservation's instance type is the instance's, never a `u-` name: only the block
    // (DescribeCapacityBlocks, and the purchase's capacityBlockSet) says UltraServer
    let env = env().await;
    let ultra = offerings(&env, "p6e-gb200.36xlarge", 1, 24).await.remove(0);
    let plain = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let u = buy(&env, &ultra, "ultra-type").await;
    let p = buy(&env, &plain, "plain-type").await;
    env.cloud.step(TimeDelta::minutes(2));
    assert_eq!(u.instance_type(), Some("p6e-gb200.36xlarge"));
    let blocks = env.ec2.describe_capacity_blocks().send().await.unwrap();
    let type_of = |cr: &aws_sdk_ec2::types::CapacityReservation| {
        blocks
            .capacity_blocks()
            .iter()
            .find(|b| b.capacity_block_id() == cr.capacity_block_id())
            .map(|b| b.ultraserver_type().map(str::to_string))
            .expect("the block is listed")
    };
    assert_eq!(type_of(&u).as_deref(), Some("u-p6e-gb200x72"));
    assert_eq!(type_of(&p), None);
}

/// A block's reservation state, read through the SDK.
async fn state_of(env: &Env, cr: &str) -> String {
    describe(env, cr)
        .await
        .state()
        .unwrap()
        .as_str()
        .to_string()
}

/// An emulator whose new reservations and plans are listed at once, for tests about
/// something other than the listing lag.
async fn env_without_lag() -> Env {
    let mut options = Options {
        seed: 42,
        start: Some(t0()),
        ..Options::default()
    };
    options.settings.listing_lag_seconds = 0;
    env_with(options).await
}

#[tokio::test]
async fn the_first_state_can_be_the_documented_payment_pending_and_nothing_else() {
    let env = env().await;
    let url = env.cloud.url();
    // only the two pre-payment states are accepted
    let (status, _) = http(
        &url,
        "PATCH",
        "/_local/settings",
        Some(r#"{"block_initial_state": "active"}"#),
    )
    .await;
    assert_eq!(status, 400);
    let (status, body) = http(
        &url,
        "PATCH",
        "/_local/settings",
        Some(r#"{"block_initial_state": "payment-pending", "listing_lag_seconds": 0}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["block_initial_state"], "payment-pending");

    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "documented").await;
    let id = cr.capacity_reservation_id().unwrap().to_string();
    assert_eq!(cr.state().unwrap().as_str(), "payment-pending");
    assert_eq!(state_of(&env, &id).await, "payment-pending");
    let blocks = env.ec2.describe_capacity_blocks().send().await.unwrap();
    assert_eq!(
        blocks.capacity_blocks()[0].state().unwrap().as_str(),
        "payment-pending"
    );
    // its payment clears as a pending block's does
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(state_of(&env, &id).await, "scheduled");
}

#[tokio::test]
async fn payment_clears_no_later_than_ten_minutes_before_the_start() {
    let env = env_without_lag().await;
    env.cloud.with_world(|w| w.settings.payment_minutes = 30);
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let start = chrono_of(offer.start_date().unwrap());
    // bought 20 minutes before its start: 30 minutes would be too late, so it clears at
    // start - 10 min
    env.cloud.advance_to(start - TimeDelta::minutes(20));
    let id = buy(&env, &offer, "soon")
        .await
        .capacity_reservation_id()
        .unwrap()
        .to_string();
    assert_eq!(
        env.cloud.next_transition(),
        Some(start - TimeDelta::minutes(10))
    );
    env.cloud.advance_to(start - TimeDelta::minutes(11));
    assert_eq!(state_of(&env, &id).await, "pending");
    env.cloud.advance_to(start - TimeDelta::minutes(10));
    assert_eq!(state_of(&env, &id).await, "scheduled");

    // bought 5 minutes before its start: the payment clears at once, never before the
    // purchase (the purchase itself still answers `pending`)
    env.cloud.advance_to(start - TimeDelta::minutes(5));
    let late = buy(&env, &offer, "sooner").await;
    assert_eq!(late.state().unwrap().as_str(), "pending");
    let late = late.capacity_reservation_id().unwrap().to_string();
    assert_eq!(state_of(&env, &late).await, "scheduled");
    env.cloud.advance_to(start + TimeDelta::minutes(5));
    assert_eq!(state_of(&env, &late).await, "active");
}

#[tokio::test]
async fn payment_clears_no_later_than_six_hours_after_the_purchase() {
    let env = env().await;
    env.cloud
        .with_world(|w| w.settings.payment_minutes = 10 * 60);
    let later = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .capacity_duration_hours(24)
        .start_date_range(smithy_of(t0() + TimeDelta::days(3)))
        .send()
        .await
        .unwrap()
        .capacity_block_offerings()[0]
        .clone();
    let id = buy(&env, &later, "slow-bank")
        .await
        .capacity_reservation_id()
        .unwrap()
        .to_string();
    assert_eq!(
        env.cloud.next_transition(),
        Some(t0() + TimeDelta::hours(6))
    );
    env.cloud
        .advance_to(t0() + TimeDelta::hours(6) - TimeDelta::seconds(1));
    assert_eq!(state_of(&env, &id).await, "pending");
    env.cloud.advance_to(t0() + TimeDelta::hours(6));
    assert_eq!(state_of(&env, &id).await, "scheduled");
}

#[tokio::test]
async fn an_extension_payment_clears_no_later_than_35_minutes_before_the_end() {
    let env = env_without_lag().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 48).await.remove(0);
    let id = buy(&env, &offer, "late-extension")
        .await
        .capacity_reservation_id()
        .unwrap()
        .to_string();
    let end = chrono_of(offer.end_date().unwrap());
    // the last moment an extension is offered: 1 hour before the end
    env.cloud.advance_to(end - TimeDelta::hours(1));
    env.cloud.with_world(|w| w.settings.payment_minutes = 60);
    let ext = env
        .ec2
        .describe_capacity_block_extension_offerings()
        .capacity_reservation_id(&id)
        .capacity_block_extension_duration_hours(24)
        .send()
        .await
        .unwrap();
    let o = ext.capacity_block_extension_offerings()[0].clone();
    env.ec2
        .purchase_capacity_block_extension()
        .capacity_block_extension_offering_id(o.capacity_block_extension_offering_id().unwrap())
        .capacity_reservation_id(&id)
        .send()
        .await
        .unwrap();
    env.cloud.advance_to(end - TimeDelta::minutes(36));
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        end
    );
    env.cloud.advance_to(end - TimeDelta::minutes(35));
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        end + TimeDelta::hours(24)
    );
}

#[tokio::test]
async fn a_forced_payment_failure_fails_the_next_blocks_bought_for_a_request_at_payment_time() {
    let env = env_without_lag().await;
    let url = env.cloud.url();
    let (status, _) = http(
        &url,
        "POST",
        "/_local/payment-failures",
        Some(r#"{"request_id": "doomed", "count": 1}"#),
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = http(
        &url,
        "POST",
        "/_local/payment-failures",
        Some(r#"{"count": 1}"#),
    )
    .await;
    assert_eq!(status, 400, "a request id is required");
    let (_, body) = http(&url, "GET", "/_local/payment-failures", None).await;
    assert_eq!(body["payment_failures"]["doomed"], 1);

    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let (az, ty) = (
        offer.availability_zone().unwrap().to_string(),
        offer.instance_type().unwrap().to_string(),
    );
    let (start, end) = (
        chrono_of(offer.start_date().unwrap()),
        chrono_of(offer.end_date().unwrap()),
    );
    let free = |env: &Env| {
        env.cloud.with_world(|w| {
            w.market.free_between(
                local_cloud::market::Pool::CapacityBlock,
                "us-east-1",
                &az,
                &ty,
                start,
                end,
            )
        })
    };
    let before = free(&env);
    let other = buy(&env, &offer, "lucky").await;
    let failing = buy(&env, &offer, "doomed").await;
    let second = buy(&env, &offer, "doomed").await;
    let (_, body) = http(&url, "GET", "/_local/payment-failures", None).await;
    assert_eq!(body["payment_failures"], serde_json::json!({}), "used up");
    assert_eq!(free(&env), before - 3);
    let [other, failing, second] =
        [other, failing, second].map(|c| c.capacity_reservation_id().unwrap().to_string());

    // until the payment time the doomed block looks like any other
    env.cloud.step(TimeDelta::minutes(4));
    assert_eq!(state_of(&env, &failing).await, "pending");
    env.cloud.step(TimeDelta::minutes(1));
    assert_eq!(state_of(&env, &failing).await, "payment-failed");
    assert_eq!(state_of(&env, &second).await, "scheduled");
    assert_eq!(state_of(&env, &other).await, "scheduled");
    // the failed block's capacity is back in the market, and it is never delivered
    assert_eq!(free(&env), before - 2);
    env.cloud.advance_to(start + TimeDelta::minutes(5));
    let delivered: Vec<String> = events_of(&env.cloud, "Capacity Block Delivered")
        .iter()
        .map(|e| {
            e["detail"]["capacity-reservation-id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(delivered.len(), 2);
    assert!(!delivered.contains(&failing));
}

#[tokio::test]
async fn a_forced_payment_failure_after_some_purchases_lets_those_pay_first() {
    // Control: `after` purchases of the request pay, then the forced failures apply (a
    // split's later block, a replacement).
    let env = env_without_lag().await;
    let url = env.cloud.url();
    let (status, _) = http(
        &url,
        "POST",
        "/_local/payment-failures",
        Some(r#"{"request_id": "later", "count": 1, "after": 1}"#),
    )
    .await;
    assert_eq!(status, 204);
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let first = buy(&env, &offer, "later").await;
    let second = buy(&env, &offer, "later").await;
    let third = buy(&env, &offer, "later").await;
    let [first, second, third] =
        [first, second, third].map(|c| c.capacity_reservation_id().unwrap().to_string());
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(state_of(&env, &first).await, "scheduled");
    assert_eq!(state_of(&env, &second).await, "payment-failed");
    assert_eq!(state_of(&env, &third).await, "scheduled");
}

#[tokio::test]
async fn a_new_block_is_missing_from_every_describe_until_the_listing_lag_has_passed() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "lagging").await;
    // the purchase's own answer is unaffected
    let id = cr.capacity_reservation_id().unwrap().to_string();
    let block_id = cr.capacity_block_id().unwrap().to_string();
    let by_tag = || {
        env.ec2
            .describe_capacity_reservations()
            .filters(
                Filter::builder()
                    .name("tag:capacity-pilot:request-id")
                    .values("lagging")
                    .build(),
            )
            .send()
    };
    let by_block_id = || {
        env.ec2
            .describe_capacity_blocks()
            .capacity_block_ids(&block_id)
            .send()
    };
    for elapsed in [0, 119] {
        env.cloud.advance_to(t0() + TimeDelta::seconds(elapsed));
        // asked by id, it is an unknown id
        let err = env
            .ec2
            .describe_capacity_reservations()
            .capacity_reservation_ids(&id)
            .send()
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("InvalidCapacityReservationId.NotFound"));
        let all = env
            .ec2
            .describe_capacity_reservations()
            .send()
            .await
            .unwrap();
        assert!(all.capacity_reservations().is_empty(), "{elapsed} s");
        assert!(by_tag().await.unwrap().capacity_reservations().is_empty());
        let blocks = env.ec2.describe_capacity_blocks().send().await.unwrap();
        assert!(blocks.capacity_blocks().is_empty());
        assert!(by_block_id().await.unwrap().capacity_blocks().is_empty());
    }
    // it exists meanwhile: its tags can be changed
    env.ec2
        .create_tags()
        .resources(&id)
        .tags(Tag::builder().key("team").value("a").build())
        .send()
        .await
        .unwrap();

    env.cloud.advance_to(t0() + TimeDelta::seconds(120));
    assert_eq!(
        describe(&env, &id).await.state().unwrap().as_str(),
        "pending"
    );
    assert_eq!(by_tag().await.unwrap().capacity_reservations().len(), 1);
    assert_eq!(
        env.ec2
            .describe_capacity_reservations()
            .send()
            .await
            .unwrap()
            .capacity_reservations()
            .len(),
        1
    );
    let blocks = by_block_id().await.unwrap();
    assert_eq!(blocks.capacity_blocks().len(), 1);
    assert_eq!(blocks.capacity_blocks()[0].capacity_reservation_ids(), [id]);
}

#[tokio::test]
async fn without_listing_lag_a_new_block_is_described_at_once() {
    let env = env_without_lag().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let id = buy(&env, &offer, "at-once")
        .await
        .capacity_reservation_id()
        .unwrap()
        .to_string();
    assert_eq!(
        describe(&env, &id).await.state().unwrap().as_str(),
        "pending"
    );
    let by_tag = env
        .ec2
        .describe_capacity_reservations()
        .filters(
            Filter::builder()
                .name("tag:capacity-pilot:request-id")
                .values("at-once")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(by_tag.capacity_reservations().len(), 1);
    let blocks = env.ec2.describe_capacity_blocks().send().await.unwrap();
    assert_eq!(blocks.capacity_blocks().len(), 1);
}

#[tokio::test]
async fn block_types_are_regional_and_an_unsupported_pair_is_an_error_not_an_empty_list() {
    // aws-reference §11.1 "Block instance types are regional".
    let env = env_in(
        Options {
            seed: 42,
            start: Some(t0()),
            ..Options::default()
        },
        "eu-west-1",
    )
    .await;
    let err = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(4)
        .capacity_duration_hours(48)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert_eq!(
        err.message(),
        Some("The instance type 'p5.48xlarge' is not supported for Capacity Blocks in 'eu-west-1'")
    );
    // Another type is sold there.
    let ok = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p4d.24xlarge")
        .instance_count(4)
        .capacity_duration_hours(48)
        .send()
        .await
        .unwrap();
    assert!(!ok.capacity_block_offerings().is_empty());
}

#[tokio::test]
async fn the_describe_limit_is_a_bucket_per_account_region_refilling_one_a_minute() {
    // aws-reference §11.1 "`CapacityBlockDescribeLimitExceeded` is an account limit";
    // ARCHITECTURE §8.10: a bucket of 5, refilling 1 a minute.
    let env = env().await;
    let search = || {
        env.ec2
            .describe_capacity_block_offerings()
            .instance_type("p5.48xlarge")
            .instance_count(4)
            .capacity_duration_hours(48)
            .send()
    };
    for _ in 0..5 {
        search().await.unwrap();
    }
    let err = search().await.unwrap_err();
    assert_eq!(err.code(), Some("CapacityBlockDescribeLimitExceeded"));
    assert!(
        !err.message().unwrap_or_default().contains("not sufficient"),
        "the rate reading"
    );
    // Another region has its own bucket.
    let other = sdk_config(&env.cloud.url(), "us-west-2", false).await;
    aws_sdk_ec2::Client::new(&other)
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(4)
        .capacity_duration_hours(48)
        .send()
        .await
        .unwrap();
    // One token a minute.
    env.cloud.step(TimeDelta::minutes(1));
    search().await.unwrap();
    assert!(search().await.is_err());
}

#[tokio::test]
async fn an_account_without_quota_for_a_family_answers_the_describe_limit_with_its_message() {
    let env = env_with(Options {
        seed: 42,
        start: Some(t0()),
        settings: Settings {
            no_block_quota: vec![("p5".into(), "us-east-1".into())],
            ..Settings::default()
        },
        ..Options::default()
    })
    .await;
    let err = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(4)
        .capacity_duration_hours(48)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("CapacityBlockDescribeLimitExceeded"));
    assert_eq!(
        err.message(),
        Some(
            "Your existing service limits for this AWS account are not sufficient to use EC2 \
             Capacity Blocks"
        )
    );
    // Another family is unaffected.
    env.ec2
        .describe_capacity_block_offerings()
        .instance_type("p4d.24xlarge")
        .instance_count(4)
        .capacity_duration_hours(48)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_search_answers_blocks_shorter_and_longer_than_asked() {
    // aws-reference §11.1 "Offerings can be shorter or longer than asked": a 24 h search has
    // returned 8 h, 24 h and 32 h offerings.
    let env = env().await;
    let out = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .capacity_duration_hours(24)
        .send()
        .await
        .unwrap();
    let minutes: Vec<i64> = out
        .capacity_block_offerings()
        .iter()
        .map(|o| {
            i64::from(o.capacity_block_duration_hours().unwrap()) * 60
                + i64::from(o.capacity_block_duration_minutes().unwrap_or(0))
        })
        .collect();
    assert!(minutes.iter().any(|&m| m < 24 * 60), "{minutes:?}");
    assert!(minutes.contains(&(24 * 60)), "{minutes:?}");
    assert!(minutes.iter().any(|&m| m > 24 * 60), "{minutes:?}");
}

#[tokio::test]
async fn instances_across_capacity_blocks_are_capped_over_the_window_account_wide() {
    // botocore `ec2` model, DescribeCapacityBlockOfferingsRequest.InstanceCount: "Each Capacity
    // Block can have up to 64 instances, and you can have up to 256 instances across Capacity
    // Blocks" (DOC capacity-blocks-purchase says the same). The code is unpublished, so it is a
    // setting; the message names the limit.
    let env = env_with_settings(Settings {
        max_block_instances: 8,
        block_limit_code: "SomeUnpublishedCode".to_string(),
        describe_limit_burst: 0,
        listing_lag_seconds: 0,
        ..Settings::default()
    })
    .await;
    let purchase = |ec2: &aws_sdk_ec2::Client, offer: &CapacityBlockOffering| {
        ec2.purchase_capacity_block()
            .capacity_block_offering_id(offer.capacity_block_offering_id().unwrap())
            .instance_platform(CapacityReservationInstancePlatform::LinuxUnix)
            .send()
    };
    let offer = offerings(&env, "p5.48xlarge", 4, 24).await.remove(0);
    let first = buy(&env, &offer, "cap-1").await;
    // 4 + 4 = 8: at the limit, not over it
    let first_paid = buy(&env, &offer, "cap-2").await;
    let err = purchase(&env.ec2, &offer).await.unwrap_err();
    assert_eq!(err.code(), Some("SomeUnpublishedCode"));
    let message = err.message().unwrap();
    assert!(
        message.starts_with(
            "You can have up to 8 instances across Capacity Blocks; this purchase of 4 would make 12 over the block's window"
        ),
        "{message}"
    );

    // Account-wide: blocks in us-east-1 count against an overlapping purchase in us-west-2.
    let west = aws_sdk_ec2::Client::new(&sdk_config(&env.cloud.url(), "us-west-2", false).await);
    let start = chrono_of(offer.start_date().unwrap());
    let end = chrono_of(offer.end_date().unwrap());
    let west_offer = west
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .capacity_duration_hours(24)
        .start_date_range(smithy_of(start))
        .end_date_range(smithy_of(end))
        .send()
        .await
        .unwrap()
        .capacity_block_offerings()
        .iter()
        .find(|o| {
            chrono_of(o.start_date().unwrap()) < end && start < chrono_of(o.end_date().unwrap())
        })
        .cloned()
        .expect("an overlapping offering in us-west-2");
    let err = purchase(&west, &west_offer).await.unwrap_err();
    assert_eq!(err.code(), Some("SomeUnpublishedCode"));
    assert!(
        err.message()
            .unwrap()
            .contains("up to 8 instances across Capacity Blocks; this purchase of 1 would make 9"),
        "{:?}",
        err.message()
    );

    // A block whose window does not overlap counts nothing.
    let later = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(8)
        .capacity_duration_hours(24)
        .start_date_range(smithy_of(end + TimeDelta::days(2)))
        .send()
        .await
        .unwrap()
        .capacity_block_offerings()[0]
        .clone();
    assert!(chrono_of(later.start_date().unwrap()) >= end);
    buy(&env, &later, "cap-later").await;

    // A payment-failed block no longer counts: its 4 instances free the window again.
    let id = first.capacity_reservation_id().unwrap();
    let (status, _) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/capacity-reservations/{id}/fail-payment"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    env.cloud.step(TimeDelta::minutes(10));
    assert_eq!(state_of(&env, id).await, "payment-failed");
    buy(&env, &offer, "cap-3").await;
    let err = purchase(&west, &west_offer).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some("SomeUnpublishedCode"),
        "scheduled blocks count"
    );

    // Active blocks count too.
    env.cloud.advance_to(start + TimeDelta::minutes(10));
    assert_eq!(
        state_of(&env, first_paid.capacity_reservation_id().unwrap()).await,
        "active"
    );
    let overlapping = west
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .capacity_duration_hours(24)
        .end_date_range(smithy_of(end))
        .send()
        .await
        .unwrap()
        .capacity_block_offerings()
        .iter()
        .find(|o| chrono_of(o.start_date().unwrap()) < end)
        .cloned()
        .expect("an offering starting inside the active window");
    let err = purchase(&west, &overlapping).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some("SomeUnpublishedCode"),
        "active blocks count"
    );
    // An expired block's window is over before any offering starts (30 min ahead at the
    // earliest), so it can never overlap one: `expired` is left out of the count by state.
}
