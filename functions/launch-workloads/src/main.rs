//! launch-workloads Lambda entry point: logging, configuration and clients are built once at cold
//! start; each invocation runs the handler.

#![recursion_limit = "256"]

use capacity_pilot::lambda::{cold_start, serve_by};
use lambda_runtime::Error;
use launch_workloads::handler::Launcher;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (config, a) = cold_start().await?;
    let handler = Launcher {
        store: a.store,
        workloads: a.workloads,
        events: a.events,
        clock: a.clock,
        config,
    };
    let handler = &handler;
    serve_by(|event, deadline| async move { handler.handle_by(event, &deadline).await }).await
}
