//! What every function's `main` does: at cold start, logging, the typed configuration and the
//! adapters, each built once; then serving EventBridge events to the handler.

use std::future::Future;
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_runtime::{Diagnostic, Error, LambdaEvent, service_fn};
use serde::Serialize;
use serde_json::Value;

use crate::aws::wiring::Adapters;
use crate::config::Config;
use crate::decision::HandlerError;
use crate::ports::WallDeadline;

/// Logging (JSON when `AWS_LAMBDA_LOG_FORMAT=JSON`, as the template sets), the configuration
/// (a bad variable stops the cold start, named) and every adapter, once.
pub async fn cold_start() -> Result<(Arc<Config>, Adapters), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Arc::new(Config::from_env()?);
    let adapters = Adapters::from_env(&config).await?;
    Ok((config, adapters))
}

/// Serves each invocation's EventBridge event to `handle` until the runtime stops. A failed
/// invocation reports its error's stable type (ARCHITECTURE §8.11), not a Rust type name.
pub async fn serve<F, Fut, O>(handle: F) -> Result<(), Error>
where
    F: Fn(EventBridgeEvent<Value>) -> Fut,
    Fut: Future<Output = Result<O, HandlerError>>,
    O: Serialize,
{
    let handle = &handle;
    serve_by(move |event, _| handle(event)).await
}

/// [`serve`], also handing `handle` the invocation's deadline, from the runtime's
/// `Lambda-Runtime-Deadline-Ms`.
pub async fn serve_by<F, Fut, O>(handle: F) -> Result<(), Error>
where
    F: Fn(EventBridgeEvent<Value>, WallDeadline) -> Fut,
    Fut: Future<Output = Result<O, HandlerError>>,
    O: Serialize,
{
    let handle = &handle;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<EventBridgeEvent<Value>>| async move {
            let deadline = WallDeadline::at_epoch_ms(event.context.deadline);
            handle(event.payload, deadline)
                .await
                .map_err(Diagnostic::from)
        },
    ))
    .await
}
