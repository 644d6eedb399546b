//! search-offerings Lambda entry point: configuration, tracing and clients are built once at cold
//! start; each invocation runs the handler.

#![recursion_limit = "256"]

use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::aws::wiring::Adapters;
use capacity_pilot::config::Config;
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use search_offerings::handler::Searcher;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    // JSON logs when AWS_LAMBDA_LOG_FORMAT=JSON, as the template sets.
    lambda_runtime::tracing::init_default_subscriber();
    let config = Arc::new(Config::from_env()?);
    let a = Adapters::from_env(&config).await?;
    let handler = Searcher {
        store: a.store,
        market: a.market,
        workloads: a.workloads,
        events: a.events,
        clock: a.clock,
        config,
    };
    let handler = &handler;
    run(service_fn(
        move |event: LambdaEvent<EventBridgeEvent<Value>>| async move {
            handler.handle(event.payload).await.map_err(Error::from)
        },
    ))
    .await
}
