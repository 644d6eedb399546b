//! Cold-start wiring shared by every function's `main`: one `SdkConfig` from the standard
//! environment (so `AWS_ENDPOINT_URL_<SERVICE>` points the clients at stand-ins offline),
//! and every adapter built from it once. Regional clients are created lazily.

use std::sync::Arc;

use aws_config::{BehaviorVersion, ConfigLoader, SdkConfig};
use aws_sdk_dynamodb::config::SharedHttpClient;
use aws_smithy_http_client::tls;

use crate::aws::capacity::{AwsMarket, AwsWorkloads};
use crate::aws::clock::ConfiguredClock;
use crate::aws::dynamodb::DynamoStore;
use crate::aws::eventbridge::EventBridgeSink;
use crate::aws::ids::RandomIds;
use crate::aws::sns::SnsNotices;
use crate::config::Config;
use crate::outbox::Announcing;
use crate::ports::{PortError, SharedIds, Sleep, default_sleep};

/// The SDK configuration loader every client is built from, in production and in the tests:
/// the standard environment and [`https_client`].
pub fn sdk_loader() -> ConfigLoader {
    aws_config::defaults(BehaviorVersion::latest()).http_client(https_client())
}

/// The SDK's own hyper client on rustls with ring: the one TLS stack the packages link (the
/// SDK's default client would bring aws-lc-rs, a second one). It speaks plain HTTP too, to
/// the offline stand-ins.
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

pub struct Adapters {
    pub sdk: SdkConfig,
    pub store: DynamoStore,
    pub market: AwsMarket,
    pub workloads: AwsWorkloads,
    /// The bus and the notices topic (ARCHITECTURE §9.2).
    pub events: Announcing<EventBridgeSink, SnsNotices>,
    pub clock: ConfiguredClock,
    /// Lease tokens: random (ARCHITECTURE §8.12).
    pub ids: SharedIds,
    /// The SDK configuration's sleep (tokio's by default), for our own retries.
    pub sleep: Sleep,
}

impl Adapters {
    /// Loads the SDK configuration from the environment and builds every adapter.
    pub async fn from_env(config: &Config) -> Result<Adapters, PortError> {
        let sdk = sdk_loader().load().await;
        Adapters::from_sdk(sdk, config)
    }

    /// Builds every adapter from a given SDK configuration (tests pass a stand-in's URL).
    pub fn from_sdk(sdk: SdkConfig, config: &Config) -> Result<Adapters, PortError> {
        let Some(topic) = config.notices_topic_arn.as_deref() else {
            return Err(PortError::Permanent {
                service: "config",
                code: "ConfigInvalid".into(),
                message: "NOTICES_TOPIC_ARN is required and not set (the stack's NoticesTopic)"
                    .into(),
            });
        };
        Ok(Adapters {
            store: DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), &config.table_name),
            market: AwsMarket::new(&sdk, config.prices.clone()),
            workloads: AwsWorkloads::new(&sdk),
            events: Announcing {
                bus: EventBridgeSink::new(&sdk, &config.event_bus_name),
                topic: SnsNotices::new(&sdk, topic),
            },
            clock: ConfiguredClock::from_url(config.clock_url.as_deref())?,
            ids: Arc::new(RandomIds),
            sleep: sdk.sleep_impl().unwrap_or_else(default_sleep),
            sdk,
        })
    }
}
