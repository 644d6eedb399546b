//! What every function's `main` does: at cold start, logging, the typed configuration and the
//! adapters, each built once; then serving EventBridge events to the handler.

use std::future::Future;
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde::Serialize;
use serde_json::Value;

use crate::aws::wiring::Adapters;
use crate::config::Config;

/// Logging (JSON when `AWS_LAMBDA_LOG_FORMAT=JSON`, as the template sets), the configuration
/// (a bad variable stops the cold start, named) and every adapter, once.
pub async fn cold_start() -> Result<(Arc<Config>, Adapters), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Arc::new(Config::from_env()?);
    let adapters = Adapters::from_env(&config).await?;
    Ok((config, adapters))
}

/// Serves each invocation's EventBridge event to `handle` until the runtime stops.
pub async fn serve<F, Fut, O, E>(handle: F) -> Result<(), Error>
where
    F: Fn(EventBridgeEvent<Value>) -> Fut,
    Fut: Future<Output = Result<O, E>>,
    O: Serialize,
    E: std::error::Error + Send + Sync + 'static,
{
    let handle = &handle;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<EventBridgeEvent<Value>>| async move {
            handle(event.payload).await.map_err(Error::from)
        },
    ))
    .await
}
