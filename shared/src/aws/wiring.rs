//! Cold-start wiring shared by every function's `main`: one `SdkConfig` from the standard
//! environment (so `AWS_ENDPOINT_URL_<SERVICE>` points the clients at stand-ins offline),
//! and every adapter built from it once. Regional clients are created lazily.

use std::sync::Arc;

use aws_config::{BehaviorVersion, SdkConfig};

use crate::aws::capacity::{AwsMarket, AwsWorkloads};
use crate::aws::clock::ConfiguredClock;
use crate::aws::dynamodb::DynamoStore;
use crate::aws::eventbridge::EventBridgeSink;
use crate::aws::ids::RandomIds;
use crate::config::Config;
use crate::ports::{PortError, SharedIds, Sleep, default_sleep};

pub struct Adapters {
    pub sdk: SdkConfig,
    pub store: DynamoStore,
    pub market: AwsMarket,
    pub workloads: AwsWorkloads,
    pub events: EventBridgeSink,
    pub clock: ConfiguredClock,
    /// Lease tokens: random (ARCHITECTURE §8.12).
    pub ids: SharedIds,
    /// The SDK configuration's sleep (tokio's by default), for our own retries.
    pub sleep: Sleep,
}

impl Adapters {
    /// Loads the SDK configuration from the environment and builds every adapter.
    pub async fn from_env(config: &Config) -> Result<Adapters, PortError> {
        let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;
        Adapters::from_sdk(sdk, config)
    }

    /// Builds every adapter from a given SDK configuration (tests pass a stand-in's URL).
    pub fn from_sdk(sdk: SdkConfig, config: &Config) -> Result<Adapters, PortError> {
        Ok(Adapters {
            store: DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), &config.table_name),
            market: AwsMarket::new(&sdk, config.prices.clone()),
            workloads: AwsWorkloads::new(&sdk),
            events: EventBridgeSink::new(&sdk, &config.event_bus_name),
            clock: ConfiguredClock::from_url(config.clock_url.as_deref())?,
            ids: Arc::new(RandomIds),
            sleep: sdk.sleep_impl().unwrap_or_else(default_sleep),
            sdk,
        })
    }
}
