//! search-offerings Lambda entry point: logging, configuration and clients are built once at cold
//! start; each invocation runs the handler.

#![recursion_limit = "256"]

use capacity_pilot::lambda::{cold_start, serve};
use lambda_runtime::Error;
use search_offerings::handler::Searcher;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (config, a) = cold_start().await?;
    let handler = Searcher {
        store: a.store,
        market: a.market,
        workloads: a.workloads,
        events: a.events,
        clock: a.clock,
        config,
        blocks_seen: Default::default(),
    };
    serve(|event| handler.handle(event)).await
}
