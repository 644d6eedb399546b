//! purchase-capacity Lambda entry point: logging, configuration and clients are built once at cold
//! start; each invocation runs the handler.

#![recursion_limit = "256"]

use capacity_pilot::lambda::{cold_start, serve};
use lambda_runtime::Error;
use purchase_capacity::handler::Purchaser;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (config, a) = cold_start().await?;
    let handler = Purchaser {
        store: a.store,
        market: a.market,
        events: a.events,
        workloads: a.workloads,
        clock: a.clock,
        config,
        ids: a.ids,
        sleep: a.sleep,
    };
    serve(|event| handler.handle(event)).await
}
