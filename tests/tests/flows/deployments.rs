//! Two deployments of capacity-pilot in one account (ARCHITECTURE 8.7): each its own table,
//! bus and `DEPLOYMENT_ID`, one emulator. Neither adopts, nor sweeps, what the other bought
//! or launched, even for the same request id.

use std::sync::Arc;

use aws_sdk_dynamodb::config::{Credentials, Region};
use capacity_pilot::aws::wiring::Adapters;
use capacity_pilot::config::Config;
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::Store;
use cleanup_expired::handler::Cleaner;
use integration_tests::TestTable;
use integration_tests::flow::{Flow, Function, REGION, SOURCE, env, envelope};
use purchase_capacity::handler::Purchaser;
use search_offerings::handler::Searcher;
use serde_json::json;

use crate::sagemaker::{submit_and_buy, tick};
use crate::windows::live_in;

/// Stack B in the same account as the flow's stack A: its own table, bus and deployment id,
/// on A's emulator.
struct StackB {
    table: TestTable,
    searcher: Searcher<
        capacity_pilot::aws::dynamodb::DynamoStore,
        capacity_pilot::aws::capacity::AwsMarket,
        capacity_pilot::aws::capacity::AwsWorkloads,
        integration_tests::flow::Events,
        capacity_pilot::aws::clock::ConfiguredClock,
    >,
    purchaser: Purchaser<
        capacity_pilot::aws::dynamodb::DynamoStore,
        capacity_pilot::aws::capacity::AwsMarket,
        integration_tests::flow::Events,
        capacity_pilot::aws::clock::ConfiguredClock,
        capacity_pilot::aws::capacity::AwsWorkloads,
    >,
    cleaner: Cleaner<
        capacity_pilot::aws::dynamodb::DynamoStore,
        capacity_pilot::aws::capacity::AwsMarket,
        capacity_pilot::aws::capacity::AwsWorkloads,
        integration_tests::flow::Events,
        capacity_pilot::aws::clock::ConfiguredClock,
    >,
}

async fn stack_b(f: &Flow) -> StackB {
    let table = TestTable::fresh().await.unwrap();
    let vars = env(
        &table.name,
        &f.cloud.url(),
        &[
            ("DEPLOYMENT_ID", "stack-b"),
            ("EVENT_BUS_NAME", "stack-b-bus"),
        ],
    );
    let config = Arc::new(
        Config::from_lookup(&|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
            .unwrap(),
    );
    let sdk = capacity_pilot::aws::wiring::sdk_loader()
        .endpoint_url(f.cloud.url())
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new("AKIDTEST", "secret", None, None, "b"))
        .load()
        .await;
    let b = Adapters::from_sdk(sdk, &config).unwrap();
    StackB {
        searcher: Searcher {
            store: table.store(),
            market: b.market.clone(),
            workloads: b.workloads.clone(),
            events: b.events.clone(),
            clock: b.clock.clone(),
            config: config.clone(),
            blocks_seen: Default::default(),
        },
        purchaser: Purchaser {
            store: table.store(),
            market: b.market.clone(),
            events: b.events.clone(),
            workloads: b.workloads.clone(),
            clock: b.clock.clone(),
            config: config.clone(),
            ids: b.ids.clone(),
            sleep: b.sleep.clone(),
        },
        cleaner: Cleaner {
            store: table.store(),
            market: b.market.clone(),
            workloads: b.workloads.clone(),
            events: b.events.clone(),
            clock: b.clock.clone(),
            config: config.clone(),
            planted: Default::default(),
        },
        table,
    }
}

#[tokio::test]
pub(crate) async fn a_second_deployment_in_the_account_neither_sweeps_nor_adopts_the_firsts() {
    // GIVEN stack A (the flow's own) bought a block for request shared-1, and stack B in the
    // same account
    let f = Flow::start().await;
    let id = "shared-1";
    assert_eq!(
        submit_and_buy(&f, f.ec2_request(id)).await,
        RequestStatus::Reserved
    );
    let a_block = f.bus_for("Capacity Reserved", id)[0]["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let b = stack_b(&f).await;

    // WHEN B is given a request with the same id for the same capacity, and its purchase
    // response is lost, so it reconciles by tag
    b.searcher
        .handle(envelope(
            "Capacity Request Submitted",
            SOURCE,
            "b-e1",
            f.ec2_request(id),
        ))
        .await
        .unwrap();
    f.cloud.with_world(|w| w.settings.listing_lag_seconds = 0);
    f.cloud.inject(local_cloud::Fault {
        operation: "PurchaseCapacityBlock".into(),
        kind: local_cloud::FaultKind::LostResponse,
        count: Some(1),
    });
    b.purchaser
        .handle(envelope(
            "Capacity Offerings Found",
            "capacity-pilot",
            "b-e2",
            json!({"request_id": id}),
        ))
        .await
        .unwrap();

    // THEN B holds the block it bought, never A's
    let rid = RequestId::parse(id).unwrap();
    let rec = b.table.store().get_request(&rid).await.unwrap().unwrap();
    assert_eq!(rec.status, RequestStatus::Reserved, "{}", rec.reason);
    let held = b.table.store().reservations(&rid).await.unwrap();
    assert_eq!(held.len(), 1);
    assert_ne!(held[0].id, a_block, "B adopted A's block");
    assert_eq!(f.blocks_for(id), 2, "each stack holds its own block");

    // WHEN A's request of its own (which B's table does not know) runs in its block
    let own = "a-only-1";
    assert_eq!(
        submit_and_buy(&f, f.ec2_request(own)).await,
        RequestStatus::Reserved
    );
    let own_block = f.bus_for("Capacity Reserved", own)[0]["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let start = f
        .purchaser
        .store
        .reservations(&RequestId::parse(own).unwrap())
        .await
        .unwrap()[0]
        .start();
    f.cloud.advance_to(start + f.activation());
    f.deliver().await;
    tick(&f, Function::Launch).await;
    assert_eq!(live_in(&f, &own_block), 4);

    // AND B's schedule sweeps
    b.cleaner
        .handle(envelope(
            "Scheduled Event",
            "aws.events",
            "b-tick-1",
            json!({}),
        ))
        .await
        .unwrap();
    // THEN A's instances live on
    assert_eq!(
        live_in(&f, &own_block),
        4,
        "stack B swept stack A's instances"
    );
}
