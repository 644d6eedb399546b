//! SDK clients for a replayable run (ARCHITECTURE §8.12): requests go to local-cloud's router
//! in-process, with no socket, and every source of variation the SDK has is given: its time
//! source, its sleep, retries without backoff, and a fixed idempotency token ([`TOKEN`]). Two
//! runs with the same seed then make the same calls and get the same answers.

use std::time::{Duration, SystemTime};

use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_smithy_async::rt::sleep::{AsyncSleep, SharedAsyncSleep, Sleep};
use aws_smithy_async::time::{SharedTimeSource, StaticTimeSource};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use capacity_pilot::aws::capacity::{AwsMarket, AwsWorkloads};
use capacity_pilot::aws::ec2::Ec2Adapter;
use capacity_pilot::aws::sagemaker::SageMakerAdapter;
use capacity_pilot::domain::catalog::PriceTable;
use tower::ServiceExt;

/// An HTTP client that hands each request to `router` in this process.
#[derive(Clone)]
pub struct InProcess {
    router: axum::Router,
    gate: Option<Gate>,
    watch: Option<Watch>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("gated", &self.gate.is_some())
            .field("watched", &self.watch.is_some())
            .finish()
    }
}

/// What every request awaits first, given the operation it calls (the simulation's gate:
/// `capacity_pilot::fakes::Gate::point`).
pub type Gate = std::sync::Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync,
>;

/// What sees every request's operation and body as it is sent (the simulation's count of
/// purchase calls).
pub type Watch = std::sync::Arc<dyn Fn(&str, &[u8]) + Send + Sync>;

impl InProcess {
    pub fn new(router: axum::Router) -> InProcess {
        InProcess {
            router,
            gate: None,
            watch: None,
        }
    }

    /// Shows every request to `watch` as it is sent, after its gate.
    pub fn with_watch(self, watch: Watch) -> InProcess {
        InProcess {
            watch: Some(watch),
            ..self
        }
    }

    /// Passes every request through `gate` first (the simulation's crash points and
    /// interleavings): one HTTP attempt is one port call.
    pub fn with_gate(self, gate: Gate) -> InProcess {
        InProcess {
            gate: Some(gate),
            ..self
        }
    }

    pub fn http_client(self) -> SharedHttpClient {
        SharedHttpClient::new(self)
    }
}

impl HttpClient for InProcess {
    fn http_connector(
        &self,
        _settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

fn connector_error(e: impl std::error::Error + Send + Sync + 'static) -> ConnectorError {
    ConnectorError::other(Box::new(e), None)
}

impl HttpConnector for InProcess {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let router = self.router.clone();
        let gate = self.gate.clone();
        let watch = self.watch.clone();
        HttpConnectorFuture::new(async move {
            let request = request.try_into_http1x().map_err(connector_error)?;
            let (parts, body) = request.into_parts();
            // Our requests are built in memory; a streaming body would be a misuse here.
            let bytes = body.bytes().unwrap_or_default().to_vec();
            if gate.is_some() || watch.is_some() {
                let op = operation(&parts.headers, &bytes);
                if let Some(gate) = gate {
                    gate(op.clone()).await;
                }
                if let Some(watch) = watch {
                    watch(&op, &bytes);
                }
            }
            let request = http::Request::from_parts(parts, axum::body::Body::from(bytes));
            let response = router
                .oneshot(request)
                .await
                .unwrap_or_else(|never| match never {});
            let (parts, body) = response.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX)
                .await
                .map_err(|e| ConnectorError::io(e.into()))?;
            let response = http::Response::from_parts(parts, SdkBody::from(bytes.to_vec()));
            HttpResponse::try_from(response).map_err(connector_error)
        })
    }
}

/// The operation a request calls: its `X-Amz-Target` (JSON protocols) or its form's
/// `Action` (EC2's query protocol).
fn operation(headers: &http::HeaderMap, body: &[u8]) -> String {
    if let Some(t) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        return t.rsplit('.').next().unwrap_or(t).to_string();
    }
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()
        .and_then(|form| form.into_iter().find(|(k, _)| k == "Action"))
        .map_or_else(|| "?".to_string(), |(_, v)| v)
}

/// A sleep that returns at once: retries and waits take no time, and none depends on the
/// machine's load.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWait;

impl AsyncSleep for NoWait {
    fn sleep(&self, _duration: Duration) -> Sleep {
        Sleep::new(std::future::ready(()))
    }
}

/// The SDK configuration of a replayable run: `http` (the in-process client, possibly
/// wrapped by a recorder), the time standing at `at`, no waiting, retries without backoff.
pub fn sdk_config(http: SharedHttpClient, region: &str, at: SystemTime) -> SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_string()))
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            Credentials::new("AKIDTEST", "secret", None, None, "replay"),
        ))
        .endpoint_url("http://local-cloud.in-process")
        .http_client(http)
        .time_source(SharedTimeSource::new(StaticTimeSource::new(at)))
        .sleep_impl(SharedAsyncSleep::new(NoWait))
        .retry_config(
            RetryConfig::standard()
                .with_initial_backoff(Duration::ZERO)
                .with_max_backoff(Duration::ZERO),
        )
        .build()
}

/// The token the SDK fills in where an operation takes one and the caller gave none. The
/// service crates make their seeded provider (`IdempotencyTokenProvider::with_seed`)
/// unnameable from outside (its module is private); the one public way in is a fixed token,
/// which is as reproducible. None of the operations we call relies on it: RunInstances'
/// `ClientToken` is always ours, and no SageMaker operation we call takes one.
pub const TOKEN: &str = "capacity-pilot-replay";

/// The market and workload adapters for `regions`, their EC2 and SageMaker clients built as
/// production builds them plus the fixed idempotency token.
pub fn seeded_adapters(
    sdk: &SdkConfig,
    regions: &[String],
    prices: PriceTable,
) -> (AwsMarket, AwsWorkloads) {
    let ec2 = |r: &str| {
        let conf = aws_sdk_ec2::config::Builder::from(sdk)
            .region(aws_sdk_ec2::config::Region::new(r.to_string()))
            .idempotency_token_provider(TOKEN)
            .build();
        aws_sdk_ec2::Client::from_conf(conf)
    };
    let sagemaker = |r: &str| {
        let conf = aws_sdk_sagemaker::config::Builder::from(sdk)
            .region(aws_sdk_sagemaker::config::Region::new(r.to_string()))
            .idempotency_token_provider(TOKEN)
            .build();
        aws_sdk_sagemaker::Client::from_conf(conf)
    };
    let adapters = |prices: PriceTable| {
        let mut e = Ec2Adapter::new(sdk, prices.clone());
        let mut s = SageMakerAdapter::new(sdk, prices);
        for r in regions {
            e = e.with_client(r, ec2(r));
            s = s.with_client(r, sagemaker(r));
        }
        (e, s)
    };
    let (e, s) = adapters(prices);
    let market = AwsMarket::from_adapters(e, s);
    let (e, s) = adapters(PriceTable::default());
    (market, AwsWorkloads::from_adapters(e, s))
}
