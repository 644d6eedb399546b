//! What every function's `main` does: at cold start, logging, the typed configuration and the
//! adapters, each built once; then serving EventBridge events to the handler.

use std::future::Future;
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use chrono::{DateTime, Utc};
use lambda_runtime::{Diagnostic, Error, LambdaEvent, service_fn};
use serde::Serialize;
use serde_json::Value;

use crate::aws::dynamodb::{DynamoStore, Pinned};
use crate::aws::wiring::Adapters;
use crate::config::Config;
use crate::decision::HandlerError;
use crate::ports::WallDeadline;

/// Logging (JSON when `AWS_LAMBDA_LOG_FORMAT=JSON`, as the template sets), the configuration
/// (a bad variable stops the cold start, named) and every adapter, once.
pub async fn cold_start() -> Result<(Arc<Config>, Adapters), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Arc::new(Config::from_env()?);
    if config.notices_topic_arn.is_none() {
        // The functions publish notices; the CLI reads the same configuration without them.
        return Err(crate::config::ConfigError {
            problems: vec![(
                "NOTICES_TOPIC_ARN".into(),
                "is required and not set (the stack's NoticesTopic)".into(),
            )],
        }
        .into());
    }
    let adapters = Adapters::from_env(&config).await?;
    let now = crate::ports::Clock::now(&adapters.clock).await?;
    check_deployment(&adapters.store, &config, now).await?;
    Ok((config, adapters))
}

/// A cold start against a table pinned to another deployment id (ARCHITECTURE §9.8): it
/// stops, naming both ids and the parameter that sets this one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "DeploymentIdChanged: table {table} belongs to deployment id {pinned:?}, but this \
     function's DEPLOYMENT_ID is {configured:?}. What the table's requests bought and launched \
     is tagged capacity-pilot:deployment={pinned:?}, and a deployment finds, drains and sweeps \
     only what carries its own id, so this one will not start. Set the stack's DeploymentId \
     parameter to {pinned:?} and deploy again (or give this stack a new table)"
)]
pub struct DeploymentIdChanged {
    pub table: String,
    pub pinned: String,
    pub configured: String,
}

/// Pins the table's deployment id at the first cold start and refuses a different one after;
/// on a table written before workload names were claimed, claims its live requests' names
/// once (ARCHITECTURE §9.8).
pub async fn check_deployment(
    store: &DynamoStore,
    config: &Config,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    match store
        .pin_deployment(&config.deployment_id, &config.unpinned_deployment_id, now)
        .await?
    {
        Pinned::Same => {
            store.claim_live_requests(now).await?;
            Ok(())
        }
        Pinned::Changed { pinned, configured } => {
            let e = DeploymentIdChanged {
                table: config.table_name.clone(),
                pinned,
                configured,
            };
            tracing::error!(error_type = "DeploymentIdChanged", "{e}");
            Err(e.into())
        }
    }
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
            handle(event.payload, deadline).await.map_err(|e| {
                // One ERROR line per failed invocation, with its stable type: what the
                // ErrorsByTypeQuery (infra/template.yaml) counts and the runbook explains.
                tracing::error!(error_type = e.error_type(), error = %e, "invocation failed");
                Diagnostic::from(e)
            })
        },
    ))
    .await
}
